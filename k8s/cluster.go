package k8s

import (
	"context"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ClusterUID returns the UID of the kube-system namespace, which lives as
// long as the cluster and so identifies it.
func ClusterUID(ctx context.Context, client kubernetes.Interface) (string, error) {
	ns, err := client.CoreV1().Namespaces().Get(ctx, metav1.NamespaceSystem, metav1.GetOptions{})
	if err != nil {
		return "", fmt.Errorf("get namespace %s: %w", metav1.NamespaceSystem, err)
	}
	if ns.UID == "" {
		return "", fmt.Errorf("get namespace %s: empty uid", metav1.NamespaceSystem)
	}
	return string(ns.UID), nil
}
