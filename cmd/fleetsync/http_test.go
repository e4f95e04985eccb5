package main

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func TestRedactArgs(t *testing.T) {
	const r = redacted
	tests := []struct {
		name string
		args []string
		want []string
	}{
		{name: "nothing secret", args: []string{"fleetsync", "--cluster-id=east", "--consul-address", "consul:8500"}},
		{name: "--consul-token=x", args: []string{"fleetsync", "--consul-token=s3cret", "--cluster-id=east"},
			want: []string{"fleetsync", "--consul-token=" + r, "--cluster-id=east"}},
		{name: "--consul-token x", args: []string{"fleetsync", "--consul-token", "s3cret", "--cluster-id=east"},
			want: []string{"fleetsync", "--consul-token", r, "--cluster-id=east"}},
		{name: "one dash, both forms", args: []string{"fleetsync", "-consul-token=s3cret", "-consul-token", "s3cret"},
			want: []string{"fleetsync", "-consul-token=" + r, "-consul-token", r}},
		{name: "a value that looks like a flag is still the value", args: []string{"fleetsync", "--consul-token", "--cluster-id=east"},
			want: []string{"fleetsync", "--consul-token", r}},
		{name: "a value with = in it", args: []string{"fleetsync", "--consul-token=a=b=c"},
			want: []string{"fleetsync", "--consul-token=" + r}},
		{name: "empty value", args: []string{"fleetsync", "--consul-token="},
			want: []string{"fleetsync", "--consul-token=" + r}},
		{name: "last argument, no value", args: []string{"fleetsync", "--consul-token"}},
		{name: "any token, password or secret flag, any case", args: []string{"fleetsync",
			"--vault-token=a", "--db-password", "b", "--client-secret=c", "--API-TOKEN", "d", "--Password=e"},
			want: []string{"fleetsync", "--vault-token=" + r, "--db-password", r, "--client-secret=" + r, "--API-TOKEN", r, "--Password=" + r}},
		{name: "*-file flags hold a path: kept", args: []string{"fleetsync",
			"--consul-token-file=/var/run/secrets/token", "--consul-token-file", "/t", "--db-password-file", "/p", "--client-secret-file=/s"}},
		{name: "subcommand", args: []string{"fleetsync", "purge", "--cluster-id=old", "--consul-token", "s3cret", "--yes"},
			want: []string{"fleetsync", "purge", "--cluster-id=old", "--consul-token", r, "--yes"}},
		{name: "the program name is not a flag", args: []string{"--consul-token", "x"}},
		{name: "-- and - are not flags", args: []string{"fleetsync", "--", "-", "--consul-token=x"},
			want: []string{"fleetsync", "--", "-", "--consul-token=" + r}},
		{name: "empty", args: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want := tt.want
			if want == nil {
				want = tt.args
			}
			before := slices.Clone(tt.args)
			if got := redactArgs(tt.args); !slices.Equal(got, want) {
				t.Errorf("redactArgs(%q)\n = %q\nwant %q", tt.args, got, want)
			}
			if !slices.Equal(tt.args, before) {
				t.Errorf("redactArgs modified its input: %q", tt.args)
			}
		})
	}
}

// TestPprofCmdlineRedacted: /debug/pprof/cmdline on the daemon's mux
// shows the command line without the token.
func TestPprofCmdlineRedacted(t *testing.T) {
	saved := os.Args
	t.Cleanup(func() { os.Args = saved })
	os.Args = []string{"/bin/fleetsync", "--cluster-id=east", "--consul-token=s3cret-a", "--consul-token", "s3cret-b", "--consul-token-file=/etc/token"}

	srv := httptest.NewServer(newMux(nil, nil, prometheus.NewRegistry(), nil, config{EnablePprof: true}))
	defer srv.Close()
	resp, err := http.Get(srv.URL + "/debug/pprof/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	want := strings.Join([]string{"/bin/fleetsync", "--cluster-id=east", "--consul-token=<redacted>", "--consul-token", "<redacted>", "--consul-token-file=/etc/token"}, "\x00")
	if resp.StatusCode != http.StatusOK || string(body) != want {
		t.Errorf("GET /debug/pprof/cmdline: %d %q, want 200 %q", resp.StatusCode, body, want)
	}
	if strings.Contains(string(body), "s3cret") {
		t.Errorf("the token shows: %q", body)
	}
}
