package main

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
)

// TestWatchCap: --to-k8s-max-watches left at its default is lifted (0: no
// cap) when Consul speaks HTTP/2, with one log line, and kept over
// HTTP/1.1 or when the probe fails; a value given on the command line or
// by its variable (the default's own value included) is honoured as
// given, without a probe.
func TestWatchCap(t *testing.T) {
	errProbe := errors.New("connection refused")
	for _, tc := range []struct {
		name    string
		args    []string
		env     map[string]string
		h2      bool
		err     error
		want    int
		probed  bool
		wantLog string
	}{
		{name: "default over HTTP/2", h2: true, want: 0, probed: true, wantLog: "Consul speaks HTTP/2: every health query blocks"},
		{name: "default over HTTP/1.1", want: 128, probed: true},
		{name: "default, probe failed", err: errProbe, want: 128, probed: true, wantLog: "cannot tell whether Consul speaks HTTP/2"},
		{name: "given over HTTP/2", args: []string{"--to-k8s-max-watches=1"}, h2: true, want: 1},
		{name: "default value given over HTTP/2", args: []string{"--to-k8s-max-watches=128"}, h2: true, want: 128},
		{name: "variable over HTTP/2", env: map[string]string{"FLEETSYNC_TO_K8S_MAX_WATCHES": "64"}, h2: true, want: 64},
		{name: "0 given over HTTP/1.1", args: []string{"--to-k8s-max-watches=0"}, want: 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := parseArgs(t, append([]string{"--cluster-id=prod"}, tc.args...), tc.env)
			if err != nil {
				t.Fatal(err)
			}
			probed := false
			probe := func(context.Context) (bool, error) { probed = true; return tc.h2, tc.err }
			var out bytes.Buffer
			got := cfg.ToK8s.watchCap(t.Context(), probe, hclog.New(&hclog.LoggerOptions{Output: &out}))
			lines := strings.Count(out.String(), "\n")
			if got != tc.want || probed != tc.probed || (tc.wantLog == "") != (lines == 0) || lines > 1 || !strings.Contains(out.String(), tc.wantLog) {
				t.Errorf("cap %d, probed %t, log %q; want %d, %t, %q", got, probed, out.String(), tc.want, tc.probed, tc.wantLog)
			}
		})
	}
	if _, err := parseArgs(t, []string{"--cluster-id=prod", "--to-k8s-max-watches=many"}, nil); err == nil || !strings.Contains(err.Error(), "to-k8s-max-watches") {
		t.Errorf("--to-k8s-max-watches=many: error %v, want one naming the flag", err)
	}
	if _, err := parseArgs(t, []string{"--cluster-id=prod", "--to-k8s-max-watches=-1"}, nil); err == nil || !strings.Contains(err.Error(), "--to-k8s-max-watches=-1") {
		t.Errorf("--to-k8s-max-watches=-1: error %v, want one naming the flag", err)
	}
}
