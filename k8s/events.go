package k8s

import (
	"os"
	"sync"

	"github.com/hashicorp/go-hclog"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/record"
)

// Recorder writes Kubernetes Events about objects, through client-go's
// EventBroadcaster: events are queued and sent by a background goroutine,
// repeated events are aggregated and counted, and each object's events are
// rate-limited by the broadcaster's spam filter. Recording never blocks; a
// full queue drops the event. Events are the only writes this package
// makes to the cluster.
type Recorder struct {
	log         hclog.Logger
	broadcaster record.EventBroadcaster
	recorder    record.EventRecorder

	mu     sync.RWMutex
	closed bool
}

// NewRecorder starts a broadcaster that sends Events from component to the
// cluster until Shutdown.
func NewRecorder(client kubernetes.Interface, component string, log hclog.Logger) *Recorder {
	if log == nil {
		log = hclog.NewNullLogger()
	}
	broadcaster := record.NewBroadcaster()
	broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: client.CoreV1().Events("")})
	host, _ := os.Hostname() // best effort: names the replica in reportingInstance
	source := corev1.EventSource{Component: component, Host: host}
	return &Recorder{
		log:         log,
		broadcaster: broadcaster,
		recorder:    broadcaster.NewRecorder(scheme.Scheme, source),
	}
}

// Warning records a Warning Event about obj. With a nil obj, or after
// Shutdown, it only logs.
func (r *Recorder) Warning(obj runtime.Object, reason, message string) {
	r.record(obj, corev1.EventTypeWarning, reason, message)
}

// Normal records a Normal Event about obj. With a nil obj, or after
// Shutdown, it only logs.
func (r *Recorder) Normal(obj runtime.Object, reason, message string) {
	r.record(obj, corev1.EventTypeNormal, reason, message)
}

func (r *Recorder) record(obj runtime.Object, eventType, reason, message string) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	if obj == nil || r.closed {
		r.logOnly(eventType, reason, message)
		return
	}
	r.log.Debug("Recording event", "type", eventType, "reason", reason, "message", message)
	r.recorder.Event(obj, eventType, reason, message)
}

func (r *Recorder) logOnly(eventType, reason, message string) {
	if eventType == corev1.EventTypeWarning {
		r.log.Warn("Event without object", "reason", reason, "message", message)
		return
	}
	r.log.Info("Event without object", "reason", reason, "message", message)
}

// Shutdown stops the broadcaster; queued events not yet sent are dropped.
// Later Warning and Normal calls only log. It is safe to call more than
// once.
func (r *Recorder) Shutdown() {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return
	}
	r.closed = true
	r.broadcaster.Shutdown()
}
