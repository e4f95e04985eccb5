package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func parseArgs(t *testing.T, args []string, env map[string]string) (config, error) {
	t.Helper()
	var cfg config
	fs := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	fs.SetOutput(new(bytes.Buffer))
	cfg.registerFlags(fs)
	err := cfg.parse(fs, args, func(k string) string { return env[k] })
	if err == nil {
		err = cfg.validate()
	}
	return cfg, err
}

// flagCase is one command line (and environment): the error it must give
// (a substring), or checks of the config it parses to.
type flagCase struct {
	name    string
	args    []string
	env     map[string]string
	wantErr string
	check   func(t *testing.T, c config)
}

func runFlagCases(t *testing.T, cases []flagCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := parseArgs(t, c.args, c.env)
			switch {
			case c.wantErr != "" && (err == nil || !strings.Contains(err.Error(), c.wantErr)):
				t.Fatalf("err = %v, want one containing %q", err, c.wantErr)
			case c.wantErr == "" && err != nil:
				t.Fatalf("err = %v", err)
			}
			if c.check != nil {
				c.check(t, cfg)
			}
		})
	}
}

func TestConfig(t *testing.T) {
	runFlagCases(t, []flagCase{
		{name: "cluster id required", wantErr: "--cluster-id is required"},
		{name: "bad cluster id", args: []string{"--cluster-id=Prod_1"}, wantErr: "must be a DNS label"},
		{name: "too long cluster id", args: []string{"--cluster-id=" + strings.Repeat("a", 64)}, wantErr: "1-63 characters"},
		{name: "defaults", args: []string{"--cluster-id=prod"}, check: func(t *testing.T, c config) {
			if c.Window != time.Second || c.DefaultSync || c.AllowNamespaces.String() != "*" || c.DenyNamespaces.String() != "kube-system" ||
				c.HTTPAddr != ":9090" || c.K8sTag != "k8s" || c.MetricsPerWorker != "top-20" {
				t.Errorf("defaults: %+v", c)
			}
		}},
		{name: "env sets flags, args win", args: []string{"--window=2s"},
			env: map[string]string{"FLEETSYNC_CLUSTER_ID": "east", "FLEETSYNC_WINDOW": "5s", "FLEETSYNC_DENY_NAMESPACE": "a,b"},
			check: func(t *testing.T, c config) {
				if c.ClusterID != "east" || c.Window != 2*time.Second || c.DenyNamespaces.String() != "a,b" {
					t.Errorf("env/args: %+v", c)
				}
			}},
		{name: "bad env value names the variable", env: map[string]string{"FLEETSYNC_WINDOW": "soon"}, wantErr: "FLEETSYNC_WINDOW"},
		{name: "repeatable namespace flags replace the default", args: []string{"--cluster-id=x", "--allow-namespace=a", "--allow-namespace=b"},
			check: func(t *testing.T, c config) {
				if c.AllowNamespaces.String() != "a,b" {
					t.Errorf("allow = %s", c.AllowNamespaces.String())
				}
			}},
		{name: "bad terminating policy", args: []string{"--cluster-id=x", "--terminating=maybe"}, wantErr: "--terminating"},
		{name: "negative window", args: []string{"--cluster-id=x", "--window=-1s"}, wantErr: "--window"},
		{name: "bad metrics-per-worker", args: []string{"--cluster-id=x", "--metrics-per-worker=some"}, wantErr: "--metrics-per-worker"},
		{name: "top-K metrics", args: []string{"--cluster-id=x", "--metrics-per-worker=top-50"}},
		{name: "sharded with default lease timing", args: []string{"--cluster-id=x", "--shards=8"}},
		{name: "renew deadline + retry reaching the lease duration", args: []string{"--cluster-id=x", "--shards=8", "--lease-renew-deadline=13s"},
			wantErr: "--lease-duration (15s)"},
		{name: "consul nodes out of range", args: []string{"--cluster-id=x", "--consul-nodes=-1"}, wantErr: "--consul-nodes=-1"},
		{name: "consul nodes above the bound", args: []string{"--cluster-id=x", "--consul-nodes=1025"}, wantErr: "--consul-nodes=1025"},
		{name: "consul nodes chosen at start by default", args: []string{"--cluster-id=x"}, check: func(t *testing.T, c config) {
			if c.ConsulNodes != 0 {
				t.Errorf("--consul-nodes default = %d, want 0 (chosen at start)", c.ConsulNodes)
			}
		}},
		{name: "zero kube api qps", args: []string{"--cluster-id=x", "--kube-api-qps=0"}, wantErr: "--kube-api-qps"},
		{name: "k8s tag equal to cluster id", args: []string{"--cluster-id=k8s"}, wantErr: "--k8s-tag"},
		{name: "bad to-k8s filter", args: []string{"--cluster-id=x", "--to-k8s", "--to-k8s-filter=Service.Meta.env =="}, wantErr: "--to-k8s-filter"},
		{name: "to-k8s filter and required tag", args: []string{"--cluster-id=x", "--to-k8s", `--to-k8s-filter=Service.Meta.env == "prod"`, "--to-k8s-require-tag=mirror"},
			check: func(t *testing.T, c config) {
				if c.ToK8s.Filter != `Service.Meta.env == "prod"` || c.ToK8s.RequireTag != "mirror" {
					t.Errorf("to-k8s: %+v", c.ToK8s)
				}
			}},
	})
}

func TestRunExitCodes(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run([]string{"--cluster-id=BAD"}, &out, &errb); code != 2 || !strings.Contains(errb.String(), "DNS label") {
		t.Errorf("bad id: code %d, stderr %q", code, errb.String())
	}
	errb.Reset()
	if code := run([]string{"--help"}, &out, &errb); code != 0 || !strings.Contains(errb.String(), "-cluster-id") {
		t.Errorf("--help: code %d, stderr %q", code, errb.String())
	}
	out.Reset()
	if code := run([]string{"--version"}, &out, &errb); code != 0 || !strings.Contains(out.String(), "fleetsync dev") {
		t.Errorf("--version: code %d, stdout %q", code, out.String())
	}
}

// TestSecretsNeverPrinted: the token flag's value is not in --help output.
func TestSecretsNeverPrinted(t *testing.T) {
	var out, errb bytes.Buffer
	t.Setenv("FLEETSYNC_CONSUL_TOKEN", "s3cr3t-token")
	run([]string{"--help"}, &out, &errb)
	if strings.Contains(out.String()+errb.String(), "s3cr3t-token") {
		t.Fatal("--help printed the Consul token")
	}
}

// TestConfigurationDoc keeps docs/configuration.md equal to the flags.
// Regenerate with make docs (it runs this test with UPDATE_DOCS=1).
func TestConfigurationDoc(t *testing.T) {
	var cfg config
	fs := flag.NewFlagSet("fleetsync", flag.ContinueOnError)
	cfg.registerFlags(fs)
	var b strings.Builder
	b.WriteString("# Configuration\n\n<!-- Generated by cmd/fleetsync/config_test.go from the flags; do not edit.\n" +
		"     Regenerate: make docs -->\n\n" +
		"Every flag can also be set with an environment variable `FLEETSYNC_<FLAG>` (upper case, `-` as `_`);\n" +
		"a flag on the command line wins over the variable. Repeatable flags take a comma-separated list\n" +
		"from the variable. Consul's own variables (`CONSUL_HTTP_ADDR`, `CONSUL_HTTP_TOKEN`,\n" +
		"`CONSUL_HTTP_TOKEN_FILE`, `CONSUL_CACERT`, `CONSUL_CLIENT_CERT`, `CONSUL_CLIENT_KEY`,\n" +
		"`CONSUL_TLS_SERVER_NAME`, `CONSUL_HTTP_SSL`) are read as consul/api reads them, and\n" +
		"`CONSUL_DATACENTER`, `CONSUL_NAMESPACE`, `CONSUL_PARTITION` are the defaults of `--consul-datacenter`,\n" +
		"`--consul-namespace` and `--consul-partition`; the `--consul-*` flags override them. With\n" +
		"`--consul-login-auth-method`, `CONSUL_HTTP_TOKEN` and `CONSUL_HTTP_TOKEN_FILE` are ignored. consul-k8s's\n" +
		"`CONSUL_LOGIN_AUTH_METHOD`, `CONSUL_LOGIN_BEARER_TOKEN_FILE`, `CONSUL_LOGIN_DATACENTER`, `CONSUL_LOGIN_META`,\n" +
		"`CONSUL_LOGIN_NAMESPACE` and `CONSUL_LOGIN_PARTITION` are the defaults of the `--consul-login-*` flags\n" +
		"(`CONSUL_LOGIN_AUTH_METHOD` not when `--consul-token` or `--consul-token-file` is given).\n" +
		"Kubernetes access: in-cluster config, else `--kubeconfig`, `$KUBECONFIG`,\n" +
		"`~/.kube/config` (client-go's loading rules).\n\n" +
		"| flag | environment variable | default | meaning |\n|---|---|---|---|\n")
	fs.VisitAll(func(f *flag.Flag) {
		def := f.DefValue
		if def == "" {
			def = " "
		} else {
			def = "`" + def + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | `%s%s` | %s | %s |\n", f.Name, envPrefix,
			strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_")), def, strings.ReplaceAll(f.Usage, "|", "\\|"))
	})
	got := b.String()
	path := filepath.Join("..", "..", "docs", "configuration.md")
	if os.Getenv("UPDATE_DOCS") != "" {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if want, err := os.ReadFile(path); err != nil || string(want) != got {
		t.Fatal("docs/configuration.md is stale; run: make docs")
	}
}
