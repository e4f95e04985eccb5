package tok8s

import (
	"testing"

	"k8s.io/apimachinery/pkg/util/validation"
)

func TestName(t *testing.T) {
	long := "a-very-long-consul-service-name-that-goes-on-and-on-and-on-and-on-x"
	seen := map[string]string{}
	for _, in := range []string{"web", "Web", "web.v2", "9lives", "_x_", "web_v2", "web-v2", long, long + "y", "日本"} {
		got := Name("", in)
		if errs := validation.IsDNS1035Label(got); len(errs) > 0 {
			t.Errorf("Name(%q) = %q: %v", in, got, errs)
		}
		if o, dup := seen[got]; dup {
			t.Errorf("Name(%q) = Name(%q) = %q", in, o, got)
		}
		seen[got] = in
	}
	if Name("c-", "web") != "c-web" || Name("", "web-v2") != "web-v2" {
		t.Errorf("valid names changed: %q, %q", Name("c-", "web"), Name("", "web-v2"))
	}
}

func TestFilter(t *testing.T) {
	f := Filter{Allow: []string{"web*", "db"}, Deny: []string{"web-internal"}}
	for name, want := range map[string]bool{"web": true, "web-a": true, "db": true, "cache": false, "web-internal": false, "consul": false} {
		if f.Mirrored(name, nil) != want {
			t.Errorf("Mirrored(%q) = %v", name, !want)
		}
	}
	if (Filter{}).Mirrored("consul", nil) || !(Filter{}).Mirrored("x", nil) {
		t.Error("the empty filter")
	}
	tagged := Filter{RequireTag: "k8s-mirror"}
	for _, tt := range []struct {
		name string
		tags []string
		want bool
	}{
		{"web", []string{"v1", "k8s-mirror"}, true},
		{"web", []string{"v1"}, false},
		{"web", nil, false},
		{"consul", []string{"k8s-mirror"}, false},
	} {
		if got := tagged.Mirrored(tt.name, tt.tags); got != tt.want {
			t.Errorf("RequireTag: Mirrored(%q, %v) = %v", tt.name, tt.tags, got)
		}
	}
}
