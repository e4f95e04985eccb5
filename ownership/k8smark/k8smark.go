package k8smark

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Label keys and the managed-by value of the mark.
const (
	LabelManagedBy = "endpointslice.kubernetes.io/managed-by"
	ManagedBy      = "to-k8s.fleetsync.io"
	LabelCluster   = "fleetsync.io/cluster"
)

// Mark is one cluster's mark.
type Mark struct{ cluster string }

// New returns the mark of cluster id; id must be a valid label value.
func New(cluster string) (Mark, error) {
	if cluster == "" {
		return Mark{}, fmt.Errorf("k8smark: cluster id is empty")
	}
	if errs := validation.IsValidLabelValue(cluster); len(errs) > 0 {
		return Mark{}, fmt.Errorf("k8smark: cluster id %q is not a label value: %s", cluster, errs[0])
	}
	return Mark{cluster: cluster}, nil
}

// Cluster is the cluster id of the mark.
func (m Mark) Cluster() string { return m.cluster }

// Selector is the label selector of exactly the objects carrying the mark.
func (m Mark) Selector() string {
	return LabelManagedBy + "=" + ManagedBy + "," + LabelCluster + "=" + m.cluster
}

// Stamp puts the mark on obj's labels (other labels are kept).
func (m Mark) Stamp(obj metav1.Object) {
	l := obj.GetLabels()
	if l == nil {
		l = map[string]string{}
	}
	l[LabelManagedBy] = ManagedBy
	l[LabelCluster] = m.cluster
	obj.SetLabels(l)
}

// Owns returns nil when obj carries this cluster's mark, else an error
// naming the object and the label that differs.
func (m Mark) Owns(obj metav1.Object) error {
	if m.cluster == "" {
		return fmt.Errorf("k8smark: empty mark owns nothing")
	}
	l := obj.GetLabels()
	if l[LabelManagedBy] != ManagedBy || l[LabelCluster] != m.cluster {
		return fmt.Errorf("%s/%s: labels %s=%q, %s=%q are not cluster %s's mark",
			obj.GetNamespace(), obj.GetName(), LabelManagedBy, l[LabelManagedBy], LabelCluster, l[LabelCluster], m.cluster)
	}
	return nil
}

// AnnotationConsulService names the Consul service a Service is fed from:
// set by the user on an import-mode Service, by fleetsync on a mirrored one.
const AnnotationConsulService = "fleetsync.io/consul-service"

// Marked reports whether labels carry any cluster's to-k8s mark: the object
// was made from Consul, and must never be synced back to Consul.
func Marked(labels map[string]string) bool { return labels[LabelManagedBy] == ManagedBy }

// FromConsul reports whether a Service with these labels and annotations
// is fed from Consul (marked, or annotated for import mode): the
// Kubernetes -> Consul direction never syncs it, whatever else selects it.
func FromConsul(labels, annotations map[string]string) bool {
	_, imported := annotations[AnnotationConsulService]
	return Marked(labels) || imported
}
