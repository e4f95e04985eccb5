package stack

import (
	"context"
	"crypto/rand"
	"fmt"
	"time"

	consulapi "github.com/hashicorp/consul/api"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// randomUUID is a random version-4 UUID (Consul wants ACL tokens in that
// form).
func randomUUID() string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		panic(fmt.Sprintf("crypto/rand: %v", err))
	}
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}

// ServiceAccountToken creates ServiceAccount ns/name if it is missing and
// mints a token for it through the TokenRequest API (as the kubelet does
// for a projected token), valid for ttl.
func (k *Kube) ServiceAccountToken(ctx context.Context, ns, name string, ttl time.Duration) (string, error) {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	if _, err := k.Client.CoreV1().ServiceAccounts(ns).Create(ctx, sa, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return "", fmt.Errorf("create service account %s/%s: %w", ns, name, err)
	}
	secs := int64(ttl / time.Second)
	tr, err := k.Client.CoreV1().ServiceAccounts(ns).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: &secs},
	}, metav1.CreateOptions{})
	if err != nil {
		return "", fmt.Errorf("token request for %s/%s: %w", ns, name, err)
	}
	return tr.Status.Token, nil
}

// KubernetesAuthMethod makes Consul (started with ACL) able to log in
// ServiceAccounts of k: a reviewer ServiceAccount in ns bound to
// system:auth-delegator (it may call the TokenReview API) and allowed to get
// ServiceAccounts, and a Consul auth
// method of type kubernetes named name with k's host, CA and the reviewer's
// token, as consul-k8s's server-acl-init sets it up.
func (c *Consul) KubernetesAuthMethod(ctx context.Context, k *Kube, name, ns string) (*consulapi.ACLAuthMethod, error) {
	reviewer := name + "-reviewer"
	jwt, err := k.ServiceAccountToken(ctx, ns, reviewer, 24*time.Hour)
	if err != nil {
		return nil, err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: ns + "-" + reviewer},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "system:auth-delegator"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: ns, Name: reviewer}},
	}
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("bind %s/%s to system:auth-delegator: %w", ns, reviewer, err)
	}
	// Consul also reads the ServiceAccount (its annotations) at each login,
	// as consul-k8s's auth-method ClusterRole allows.
	cr := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "fleetsync-test-serviceaccount-reader"},
		Rules: []rbacv1.PolicyRule{{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"get"}}}}
	if _, err := k.Client.RbacV1().ClusterRoles().Create(ctx, cr, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("create cluster role %s: %w", cr.Name, err)
	}
	crb2 := crb.DeepCopy()
	crb2.Name += "-sa-reader"
	crb2.RoleRef.Name = cr.Name
	if _, err := k.Client.RbacV1().ClusterRoleBindings().Create(ctx, crb2, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return nil, fmt.Errorf("bind %s/%s to %s: %w", ns, reviewer, cr.Name, err)
	}
	m, _, err := c.Client.ACL().AuthMethodCreate(&consulapi.ACLAuthMethod{
		Name: name, Type: "kubernetes", Description: "fleetsync test: ServiceAccounts of the test kube-apiserver",
		Config: map[string]interface{}{"Host": k.URL, "CACert": string(k.CAPEM), "ServiceAccountJWT": jwt},
	}, (&consulapi.WriteOptions{}).WithContext(ctx))
	if err != nil {
		return nil, fmt.Errorf("create consul auth method %s: %w", name, err)
	}
	return m, nil
}
