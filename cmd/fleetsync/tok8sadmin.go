package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/fleetsync/fleetsync/k8s/apply"
	"github.com/fleetsync/fleetsync/ownership/k8smark"
)

// mirrored is one Kubernetes Service fed from Consul, as the objects
// carrying a to-k8s mark show it: in mirror mode the Service and its
// slices carry the mark, in import mode only the slices do (the Service
// is the user's).
type mirrored struct {
	Cluster       string `json:"cluster"`
	Namespace     string `json:"namespace"`
	Service       string `json:"service"`
	ConsulService string `json:"consulService"`
	Mode          string `json:"mode"` // mirror or import
	Slices        int    `json:"slices"`
	Endpoints     int    `json:"endpoints"`
	Ready         int    `json:"ready"`

	svc    *corev1.Service
	slices []*discoveryv1.EndpointSlice
}

// listMirrored reads every Service and EndpointSlice selected by selector
// (a to-k8s mark, any cluster's or one's) in every namespace, grouped by
// cluster and Service, sorted.
func listMirrored(ctx context.Context, kube kubernetes.Interface, selector string) ([]*mirrored, error) {
	svcs, err := kube.CoreV1().Services("").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list services %s: %w", selector, err)
	}
	slices, err := kube.DiscoveryV1().EndpointSlices("").List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("list endpointslices %s: %w", selector, err)
	}
	by := map[[3]string]*mirrored{}
	get := func(cluster, ns, name string) *mirrored {
		k := [3]string{cluster, ns, name}
		if by[k] == nil {
			by[k] = &mirrored{Cluster: cluster, Namespace: ns, Service: name, Mode: "import"}
		}
		return by[k]
	}
	for i := range svcs.Items {
		s := &svcs.Items[i]
		m := get(s.Labels[k8smark.LabelCluster], s.Namespace, s.Name)
		m.svc, m.Mode, m.ConsulService = s, "mirror", s.Annotations[k8smark.AnnotationConsulService]
	}
	for i := range slices.Items {
		s := &slices.Items[i]
		m := get(s.Labels[k8smark.LabelCluster], s.Namespace, s.Labels[discoveryv1.LabelServiceName])
		m.slices = append(m.slices, s)
		m.Slices++
		for _, ep := range s.Endpoints {
			m.Endpoints++
			if ep.Conditions.Ready != nil && *ep.Conditions.Ready {
				m.Ready++
			}
		}
	}
	out := make([]*mirrored, 0, len(by))
	for _, m := range by {
		if m.Mode == "import" && m.Service != "" {
			// The user's Service names the Consul service; gone or
			// unreadable, the slices are still listed.
			if s, err := kube.CoreV1().Services(m.Namespace).Get(ctx, m.Service, metav1.GetOptions{}); err == nil {
				m.ConsulService = s.Annotations[k8smark.AnnotationConsulService]
			}
		}
		out = append(out, m)
	}
	sort.Slice(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Cluster != b.Cluster {
			return a.Cluster < b.Cluster
		}
		if a.Namespace != b.Namespace {
			return a.Namespace < b.Namespace
		}
		return a.Service < b.Service
	})
	return out, nil
}

func writeMirroredTable(w io.Writer, ms []*mirrored) error {
	if len(ms) == 0 {
		_, err := fmt.Fprintf(w, "No Kubernetes object carries a to-k8s mark (%s=%s).\n", k8smark.LabelManagedBy, k8smark.ManagedBy)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "CLUSTER\tNAMESPACE\tSERVICE\tCONSUL SERVICE\tMODE\tSLICES\tENDPOINTS\tREADY")
	for _, m := range ms {
		consul := m.ConsulService
		if consul == "" {
			consul = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\n", m.Cluster, m.Namespace, m.Service, consul, m.Mode, m.Slices, m.Endpoints, m.Ready)
	}
	return tw.Flush()
}

// purgeMirrored deletes every object of ms through w (preconditions: the
// UID and resourceVersion read), slices first, then the Services; it
// returns how many it deleted and the first error (it goes on past one).
func purgeMirrored(ctx context.Context, w *apply.Writer, ms []*mirrored) (deleted int, first error) {
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, m := range ms {
		for _, s := range m.slices {
			err := w.DeleteSlice(ctx, s)
			keep(err)
			if err == nil {
				deleted++
			}
		}
	}
	for _, m := range ms {
		if m.svc != nil {
			err := w.DeleteService(ctx, m.svc)
			keep(err)
			if err == nil {
				deleted++
			}
		}
	}
	return deleted, first
}

// registerKubeFlags defines the daemon's Kubernetes access flags on fs,
// bound to cfg's fields, as registerConsulFlags does for Consul's.
func registerKubeFlags(fs *flag.FlagSet, cfg *config) {
	all := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	cfg.registerFlags(all)
	for _, name := range []string{"kubeconfig", "context"} {
		f := all.Lookup(name)
		fs.Var(f.Value, f.Name, f.Usage)
	}
}

// kubeClient is the Kubernetes client of an operator subcommand.
func kubeClient(cfg config) (kubernetes.Interface, error) {
	rc, err := kubeConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes config: %w", err)
	}
	return kubernetes.NewForConfig(rc)
}
