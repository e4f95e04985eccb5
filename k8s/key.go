package k8s

import (
	"fmt"
	"strings"
)

// Key identifies a Service.
type Key struct{ Namespace, Name string }

// String returns "namespace/name", the form informer caches use.
func (k Key) String() string { return k.Namespace + "/" + k.Name }

// ParseKey parses "namespace/name". Both parts must be non-empty and the
// name must not contain another slash.
func ParseKey(s string) (Key, error) {
	ns, name, ok := strings.Cut(s, "/")
	if !ok || ns == "" || name == "" || strings.Contains(name, "/") {
		return Key{}, fmt.Errorf("parse service key %q: want namespace/name", s)
	}
	return Key{Namespace: ns, Name: name}, nil
}
