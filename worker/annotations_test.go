package worker

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/fleetsync/fleetsync/k8s"
)

// wantErr checks err against a wanted substring ("" means no error).
func wantErr(t *testing.T, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Fatalf("unexpected error: %v", err)
	case want != "" && err == nil:
		t.Fatalf("no error, want one containing %q", want)
	case want != "" && !strings.Contains(err.Error(), want):
		t.Fatalf("error %q does not contain %q", err, want)
	}
}

func nTags(n int) string {
	tags := make([]string, n)
	for i := range tags {
		tags[i] = "t" + strings.Repeat("x", i%7)
	}
	return strings.Join(tags, ",")
}

func TestParseTags(t *testing.T) {
	tests := []struct {
		name, in string
		want     []string
		err      string
	}{
		{name: "empty", in: ""},
		{name: "only spaces", in: "   "},
		{name: "only commas", in: ",,,"},
		{name: "one", in: "a", want: []string{"a"}},
		{name: "two", in: "a,b", want: []string{"a", "b"}},
		{name: "order kept", in: "b,a", want: []string{"b", "a"}},
		{name: "spaces trimmed", in: "  a ,\tb\n", want: []string{"a", "b"}},
		{name: "inner spaces kept", in: "a b, c  d", want: []string{"a b", "c  d"}},
		{name: "empties dropped", in: "a,,b, ,", want: []string{"a", "b"}},
		{name: "escaped comma", in: `a\,b,c`, want: []string{"a,b", "c"}},
		{name: "escaped comma at end", in: `a\,`, want: []string{"a,"}},
		{name: "only escaped comma", in: `\,`, want: []string{","}},
		{name: "escaped comma and spaces", in: ` a\, b , c`, want: []string{"a, b", "c"}},
		{name: "backslash not before comma kept", in: `a\b,c\`, want: []string{`a\b`, `c\`}},
		{name: "double backslash escapes only the comma", in: `a\\,b`, want: []string{`a\,b`}},
		{name: "duplicates kept", in: "a,a", want: []string{"a", "a"}},
		{name: "punctuation", in: "v=1,env:prod,x/y", want: []string{"v=1", "env:prod", "x/y"}},
		{name: "unicode", in: "ünï,日本", want: []string{"ünï", "日本"}},
		{name: "non-UTF-8", in: "a,\xff", err: "not valid UTF-8"},
		{name: "truncated rune", in: "日"[:2], err: "not valid UTF-8"},
		{name: "128 tags", in: nTags(128), want: strings.Split(nTags(128), ",")},
		{name: "129 tags", in: nTags(129), err: "has 129 tags, at most 128"},
		{name: "128 tags and empties", in: nTags(128) + ",,, ,", want: strings.Split(nTags(128), ",")},
		{name: "255-byte tag", in: strings.Repeat("x", 255), want: []string{strings.Repeat("x", 255)}},
		{name: "256-byte tag", in: "a," + strings.Repeat("x", 256), err: "is 256 bytes long, at most 255"},
		{name: "long multibyte tag", in: strings.Repeat("日", 100), err: "is 300 bytes long"},
		{name: "long tag after trimming is short", in: strings.Repeat(" ", 300) + "a", want: []string{"a"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTags(tt.in)
			wantErr(t, err, tt.err)
			if err != nil {
				if got != nil {
					t.Errorf("tags %q returned with an error", got)
				}
				return
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("ParseTags(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
}

func TestParsePort(t *testing.T) {
	tests := []struct {
		in   string
		want PortChoice
		err  string
	}{
		{in: "80", want: PortChoice{Number: 80}},
		{in: " 443 ", want: PortChoice{Number: 443}},
		{in: "1", want: PortChoice{Number: 1}},
		{in: "65535", want: PortChoice{Number: 65535}},
		{in: "0", err: "out of range"},
		{in: "65536", err: "out of range"},
		{in: "-1", err: "out of range"},
		{in: "99999999999999999999", err: "out of range"},
		{in: "-99999999999999999999", err: "out of range"},
		{in: "http", want: PortChoice{Name: "http"}},
		{in: " http ", want: PortChoice{Name: "http"}},
		{in: "grpc-web", want: PortChoice{Name: "grpc-web"}},
		{in: "h2c", want: PortChoice{Name: "h2c"}},
		{in: strings.Repeat("p", 63), want: PortChoice{Name: strings.Repeat("p", 63)}},
		{in: strings.Repeat("p", 64), err: "neither a port number nor a valid port name"},
		{in: "", err: "must not be empty"},
		{in: "   ", err: "must not be empty"},
		{in: "-http", err: "neither"},
		{in: "http-", err: "neither"},
		{in: "ht_tp", err: "neither"},
		{in: "a.b", err: "neither"},
		{in: "80.5", err: "neither"},
		{in: "80,81", err: "neither"},
		{in: "http metrics", err: "neither"},
		{in: "\xff", err: "neither"},
		{in: "日本", err: "neither"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParsePort(tt.in)
			wantErr(t, err, tt.err)
			if err == nil && got != tt.want {
				t.Errorf("ParsePort(%q) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestParseWindow(t *testing.T) {
	tests := []struct {
		in   string
		want time.Duration
		err  string
	}{
		{in: "0", want: 0},
		{in: "0s", want: 0},
		{in: "500ms", want: 500 * time.Millisecond},
		{in: " 2s ", want: 2 * time.Second},
		{in: "1.5s", want: 1500 * time.Millisecond},
		{in: "1m30s", want: 90 * time.Second},
		{in: "1h", want: time.Hour},
		{in: "1h0m0.001s", err: "between 0 and 1h0m0s"},
		{in: "-1s", err: "between 0"},
		{in: "1", err: "not a Go duration"},
		{in: "", err: "not a Go duration"},
		{in: "fast", err: "not a Go duration"},
		{in: "1e3s", err: "not a Go duration"},
		{in: "9999999999h", err: "not a Go duration"},
		{in: "1s\xff", err: "not a Go duration"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			got, err := ParseWindow(tt.in)
			wantErr(t, err, tt.err)
			if err == nil && got != tt.want {
				t.Errorf("ParseWindow(%q) = %v, want %v", tt.in, got, tt.want)
			}
		})
	}
}

func TestValidateMeta(t *testing.T) {
	tests := []struct {
		name, key, value, err string
	}{
		{name: "plain", key: "team", value: "payments"},
		{name: "letters digits dash underscore", key: "A_b-9", value: "x"},
		{name: "empty value", key: "team", value: ""},
		{name: "value with spaces and unicode", key: "owner", value: "Zoë Ünïcode, team 7"},
		{name: "128-char key", key: strings.Repeat("k", 128), value: "x"},
		{name: "129-char key", key: strings.Repeat("k", 129), value: "x", err: "129 characters long, at most 128"},
		{name: "512-byte value", key: "k", value: strings.Repeat("v", 512)},
		{name: "513-byte value", key: "k", value: strings.Repeat("v", 513), err: "513 characters long, at most 512"},
		{name: "empty key", key: "", value: "x", err: "may only contain"},
		{name: "dot in key", key: "a.b", value: "x", err: "may only contain"},
		{name: "slash in key", key: "a/b", value: "x", err: "may only contain"},
		{name: "space in key", key: "a b", value: "x", err: "may only contain"},
		{name: "unicode key", key: "ä", value: "x", err: "may only contain"},
		{name: "non-UTF-8 key", key: "\xff", value: "x", err: "may only contain"},
		{name: "consul- prefix", key: "consul-version", value: "x", err: "prefix consul- is reserved"},
		{name: "bare consul-", key: "consul-", value: "x", err: "prefix consul- is reserved"},
		{name: "consul without dash", key: "consulate", value: "x"},
		{name: "non-UTF-8 value", key: "k", value: "a\xffb", err: "not valid UTF-8"},
	}
	for k := range reservedMeta {
		tests = append(tests, struct{ name, key, value, err string }{
			name: "reserved " + k, key: k, value: "x", err: "set by fleetsync",
		})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantErr(t, ValidateMeta(tt.key, tt.value, reservedMeta), tt.err)
		})
	}
}

func TestValidateServiceName(t *testing.T) {
	tests := []struct {
		in, err string
	}{
		{in: "web"},
		{in: "a"},
		{in: "9"},
		{in: "web-2"},
		{in: "Web"},
		{in: strings.Repeat("a", 63)},
		{in: strings.Repeat("a", 64), err: "64 characters long, at most 63"},
		{in: "", err: "must not be empty"},
		{in: "-web", err: "DNS label"},
		{in: "web-", err: "DNS label"},
		{in: "we_b", err: "DNS label"},
		{in: "web.shop", err: "DNS label"},
		{in: "web shop", err: "DNS label"},
		{in: " web", err: "DNS label"},
		{in: "wéb", err: "DNS label"},
		{in: "w\xffb", err: "DNS label"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			wantErr(t, ValidateServiceName(tt.in), tt.err)
		})
	}
}

func TestAnnotationErrorValue(t *testing.T) {
	tests := []struct {
		name, value, want string
		prefix            bool // want is only a prefix of Value
	}{
		{name: "short", value: "abc", want: "abc"},
		{name: "64 bytes kept", value: strings.Repeat("x", 64), want: strings.Repeat("x", 64)},
		{name: "long truncated", value: strings.Repeat("x", 100), want: strings.Repeat("x", 64) + "..."},
		{name: "non-UTF-8 replaced", value: "a\xffb", want: "a\uFFFDb"},
		{name: "rune cut by truncation", value: "xx" + strings.Repeat("日", 30), want: "xx" + strings.Repeat("日", 20), prefix: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := annotationError("shop/web", AnnotationTags, tt.value, "bad")
			if tt.prefix && !strings.HasPrefix(err.Value, tt.want) || !tt.prefix && err.Value != tt.want {
				t.Errorf("Value = %q, want %q", err.Value, tt.want)
			}
			msg := err.Error()
			if !utf8.ValidString(msg) {
				t.Errorf("Error() %q is not valid UTF-8", msg)
			}
			for _, part := range []string{"shop/web", AnnotationTags, "bad"} {
				if !strings.Contains(msg, part) {
					t.Errorf("Error() %q does not name %q", msg, part)
				}
			}
			var ae *AnnotationError
			if !errors.As(error(err), &ae) || !IsAnnotationError(err) {
				t.Error("not an *AnnotationError")
			}
		})
	}
}

// FuzzParseTags: ParseTags never panics; what it returns obeys its
// contract, and the tags escaped again parse back to the same tags.
func FuzzParseTags(f *testing.F) {
	for _, s := range []string{"", "a,b", ` a\, b ,c`, `a\\,b`, `a\`, ",,,", "\xff", nTags(129), strings.Repeat("日", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		tags, err := ParseTags(in)
		if err != nil {
			if tags != nil {
				t.Fatalf("tags returned with error %v", err)
			}
			if !utf8.ValidString(err.Error()) && utf8.ValidString(in) {
				t.Fatalf("error %q is not valid UTF-8", err)
			}
			return
		}
		if !utf8.ValidString(in) {
			t.Fatalf("accepted non-UTF-8 input %q", in)
		}
		if len(tags) > maxTags {
			t.Fatalf("%d tags accepted", len(tags))
		}
		escapable := true
		for _, tag := range tags {
			if tag == "" || tag != strings.TrimSpace(tag) || len(tag) > maxTagLen || !utf8.ValidString(tag) {
				t.Fatalf("bad tag %q from %q", tag, in)
			}
			// A tag ending in a backslash cannot be followed by a
			// separator without escaping it: it does not parse back.
			if strings.HasSuffix(tag, `\`) {
				escapable = false
			}
		}
		if !escapable {
			return
		}
		parts := make([]string, len(tags))
		for i, tag := range tags {
			parts[i] = strings.ReplaceAll(tag, ",", `\,`)
		}
		again, err := ParseTags(strings.Join(parts, ","))
		if err != nil || !slices.Equal(again, tags) {
			t.Fatalf("%q escaped and parsed again: got %q, %v", tags, again, err)
		}
	})
}

// FuzzDesired puts random annotation values into Desired: it never panics,
// its errors are *AnnotationError naming the Service and an annotation that
// is set, and what it returns is stamped, sorted and unique.
func FuzzDesired(f *testing.F) {
	// present selects which annotations are set (bit i: i-th argument).
	f.Add(uint8(0), "", "", "", "", "", "", "")
	f.Add(uint8(0xff), "true", "web-api", "http", "a,b", "2s", "team", "payments")
	f.Add(uint8(0xff), "yes", "web_api", "99999999999999999999", "\xff", "-1s", "consul-x", "v")
	f.Add(uint8(0x04), "", "", "8080", "", "", "", "")
	f.Add(uint8(0x08), "", "", "", nTags(200), "", "", "")
	f.Add(uint8(0x30), "", "", "", "", "1h1s", "k8s-cluster", "west")
	f.Fuzz(func(t *testing.T, present uint8, sync, name, port, tags, window, metaKey, metaValue string) {
		if present&0x20 != 0 && len(validation.IsQualifiedName(AnnotationMeta+metaKey)) != 0 {
			t.Skip("the API server accepts no such annotation key")
		}
		cfg := testConfig(t)
		cfg.RegisterNotReady = present&0x80 != 0
		svc := newSvc([]k8s.Endpoint{ready("10.0.0.1", "a"), ready("fd00::1", "b"),
			{Address: "10.0.0.3", Ports: map[string]int32{"http": 8080}, Serving: true, Terminating: true}})
		set := map[string]bool{}
		for i, kv := range [][2]string{
			{AnnotationSync, sync}, {AnnotationName, name}, {AnnotationPort, port},
			{AnnotationTags, tags}, {AnnotationWindow, window}, {AnnotationMeta + metaKey, metaValue},
		} {
			if present&(1<<i) != 0 {
				svc.Annotations[kv[0]] = kv[1]
				set[kv[0]] = true
			}
		}
		spec, err := Desired(svc, cfg)
		if err != nil {
			var ae *AnnotationError
			if !errors.As(err, &ae) {
				t.Fatalf("error %T %v is not an *AnnotationError", err, err)
			}
			if ae.Service != "shop/web" {
				t.Fatalf("error names Service %q", ae.Service)
			}
			if !set[ae.Annotation] {
				t.Fatalf("error names annotation %q, which is not set (set: %v)", ae.Annotation, set)
			}
			if v := strings.TrimSpace(port); ae.Annotation == AnnotationPort && v != "" && strings.Trim(v, "0123456789") == "" && !strings.Contains(ae.Reason, "out of range") {
				t.Fatalf("number %q not reported as out of range: %v", v, ae)
			}
			if !utf8.ValidString(ae.Error()) {
				t.Fatalf("error %q is not valid UTF-8", ae.Error())
			}
			return
		}
		if err := ValidateConsulServiceName(spec.Name); err != nil {
			t.Fatalf("invalid name %q accepted: %v", spec.Name, err)
		}
		if ValidateServiceName(spec.Name) != nil && !slices.ContainsFunc(spec.Warnings, func(w string) bool { return strings.Contains(w, "does not resolve") }) {
			t.Fatalf("name %q that Consul DNS cannot look up accepted without a warning: %q", spec.Name, spec.Warnings)
		}
		if spec.Window < 0 || spec.Window > maxWindow {
			t.Fatalf("window %v", spec.Window)
		}
		for i, inst := range spec.Instances {
			if err := cfg.Cluster.Stamped(inst); err != nil {
				t.Fatal(err)
			}
			if i > 0 && spec.Instances[i-1].ID >= inst.ID {
				t.Fatalf("instances not sorted and unique: %q then %q", spec.Instances[i-1].ID, inst.ID)
			}
			if inst.Port < 1 || inst.Port > 65535 {
				t.Fatalf("port %d", inst.Port)
			}
			if len(inst.Meta) > maxMetaPairs {
				t.Fatalf("%d meta pairs", len(inst.Meta))
			}
		}
		for _, w := range spec.Warnings {
			if !utf8.ValidString(w) {
				t.Fatalf("warning %q is not valid UTF-8", w)
			}
		}
	})
}

// TestConsulK8sNames: what consul-k8s syncs is synced, with a warning
// naming the Service and the annotation where Consul DNS cannot look the
// name up; --strict-annotations refuses the same (TestDesiredErrors).
func TestConsulK8sNames(t *testing.T) {
	long := strings.Repeat("a", 255)
	tests := []struct {
		name     string
		svc      *k8s.Service
		cfg      func(*Config)
		want     string
		warnings []string // substrings, one per warning
	}{
		{name: "DNS label", svc: newSvc(nil, withAnn(AnnotationName, "web-api")), want: "web-api"},
		{name: "dotted", svc: newSvc(nil, withAnn(AnnotationName, "web.api")), want: "web.api",
			warnings: []string{`annotation consul.hashicorp.com/service-name="web.api": Consul service name must be a DNS label`}},
		{name: "underscore, trimmed", svc: newSvc(nil, withAnn(AnnotationName, " web_api ")), want: "web_api",
			warnings: []string{"web_api.service.consul does not resolve"}},
		{name: "255 characters", svc: newSvc(nil, withAnn(AnnotationName, long)), want: long,
			warnings: []string{"255 characters long, at most 63"}},
		{name: "UTF-8", svc: newSvc(nil, withAnn(AnnotationName, "wéb")), want: "wéb", warnings: []string{"DNS label"}},
		{name: "prefix and suffix over 63", svc: newSvc(nil), cfg: func(c *Config) { c.ServicePrefix = strings.Repeat("p", 60); c.AddNamespaceSuffix = true },
			want: strings.Repeat("p", 60) + "web-shop", warnings: []string{"(none: name from --service-prefix and metadata.name)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			if tt.cfg != nil {
				tt.cfg(&cfg)
			}
			spec, err := Desired(newSvcWith(tt.svc, ready("10.0.0.1", "a")), cfg)
			if err != nil {
				t.Fatal(err)
			}
			if spec.Name != tt.want || len(spec.Instances) != 1 || spec.Instances[0].Name != tt.want {
				t.Fatalf("name %q, instances %+v, want %q", spec.Name, spec.Instances, tt.want)
			}
			if len(spec.Warnings) != len(tt.warnings) {
				t.Fatalf("warnings %q, want %d", spec.Warnings, len(tt.warnings))
			}
			for i, w := range tt.warnings {
				if !strings.Contains(spec.Warnings[i], w) || !strings.Contains(spec.Warnings[i], "service shop/web") {
					t.Errorf("warning %q, want one naming shop/web and containing %q", spec.Warnings[i], w)
				}
			}
		})
	}
}

// TestConsulK8sPortFallback: a service-port name the Service lacks falls
// back to its first port, as consul-k8s does, with a warning.
func TestConsulK8sPortFallback(t *testing.T) {
	svc := newSvc([]k8s.Endpoint{ready("10.0.0.1", "a")}, withAnn(AnnotationPort, "grpc"))
	spec, err := Desired(svc, testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(spec.Instances) != 1 || spec.Instances[0].Port != 8080 {
		t.Fatalf("instances %+v, want the first port's endpoint port 8080", spec.Instances)
	}
	want := `service shop/web: annotation consul.hashicorp.com/service-port="grpc": no port named "grpc" in spec.ports: using the first port, "http"`
	if len(spec.Warnings) != 1 || spec.Warnings[0] != want {
		t.Fatalf("warnings %q, want %q", spec.Warnings, want)
	}
	svc.Ports[0].Name = ""
	svc.Endpoints[0].Ports = map[string]int32{"": 8081}
	if spec, err = Desired(svc, testConfig(t)); err != nil || len(spec.Instances) != 1 || spec.Instances[0].Port != 8081 ||
		len(spec.Warnings) != 1 || !strings.HasSuffix(spec.Warnings[0], "using the first port, port 80") {
		t.Fatalf("unnamed first port: %+v, %v", spec, err)
	}
}

// newSvcWith sets svc's endpoints.
func newSvcWith(svc *k8s.Service, eps ...k8s.Endpoint) *k8s.Service {
	svc.Endpoints = eps
	return svc
}
