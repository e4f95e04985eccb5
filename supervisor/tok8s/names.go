package tok8s

import (
	"crypto/sha256"
	"encoding/hex"
	"path"
	"slices"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Filter is the name filter of mirror mode.
type Filter struct {
	Allow []string // globs (path.Match); empty: all
	Deny  []string // globs; deny wins
	// RequireTag, when set, leaves out a name none of whose instances
	// carries it (the health read then keeps only the instances that do).
	RequireTag string
}

// Validate checks the patterns.
func (f Filter) Validate() error {
	for _, p := range append(append([]string{}, f.Allow...), f.Deny...) {
		if _, err := path.Match(p, ""); err != nil {
			return err
		}
	}
	return nil
}

// Mirrored reports whether Consul service name, whose instances carry
// tags (the catalog's union), is mirrored.
func (f Filter) Mirrored(name string, tags []string) bool {
	if name == "consul" || (f.RequireTag != "" && !slices.Contains(tags, f.RequireTag)) {
		return false
	}
	for _, p := range f.Deny {
		if ok, _ := path.Match(p, name); ok {
			return false
		}
	}
	if len(f.Allow) == 0 {
		return true
	}
	for _, p := range f.Allow {
		if ok, _ := path.Match(p, name); ok {
			return true
		}
	}
	return false
}

// Name is the Service name of Consul service consul with prefix: the
// name itself when valid (a DNS-1035 label), else a sanitised form with a
// hash of the original, so that two names never meet and the result is
// always valid.
func Name(prefix, consul string) string {
	n := prefix + consul
	if len(validation.IsDNS1035Label(n)) == 0 {
		return n
	}
	var b strings.Builder
	for _, r := range strings.ToLower(n) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('-')
		}
	}
	s := strings.Trim(b.String(), "-")
	if s == "" || s[0] < 'a' {
		s = "c-" + s
	}
	sum := sha256.Sum256([]byte(n))
	h := hex.EncodeToString(sum[:])[:8]
	if len(s) > 63-9 {
		s = strings.TrimRight(s[:63-9], "-")
	}
	return s + "-" + h
}
