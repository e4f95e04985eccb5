// Package deploy tests what an operator installs and runs: the Helm chart
// and the kustomize base (lint, render, server-side dry run against a real
// kube-apiserver), the RBAC they grant (fleetsync runs with a token of the
// chart's ServiceAccount and syncs), the Grafana dashboard, and the
// operator commands `fleetsync status` and `fleetsync purge` against a real
// Consul.
//
// helm and kubectl come from the tool cache like the servers
// (test/tools/build.sh, `make tools`). Under -short only the tests that need
// neither servers nor tools run.
package deploy

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetsync/fleetsync/test/fixture"
	"github.com/fleetsync/fleetsync/test/stack"
)

// The shared stack and tools; nil/"" under -short.
var (
	kube  *stack.Kube
	tools string // dir holding helm and kubectl
	seq   atomic.Int64
)

// repoRoot is the checkout this test file is in.
var repoRoot = func() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}()

var (
	chartDir     = filepath.Join(repoRoot, "deploy", "helm", "fleetsync")
	kustomizeDir = filepath.Join(repoRoot, "deploy", "kustomize")
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	dir, err := stack.BinDir()
	if err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		return 1
	}
	for _, name := range []string{"helm", "kubectl"} {
		if fi, err := os.Stat(filepath.Join(dir, name)); err != nil || fi.Mode().Perm()&0o111 == 0 {
			fmt.Fprintf(os.Stderr, "deploy: %s is not in %s (run `make tools`, which builds it with test/tools/build.sh)\n", name, dir)
			return 1
		}
	}
	tools = dir
	if kube, err = stack.StartKube(ctx, stack.KubeOptions{}); err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		return 1
	}
	defer kube.Stop()
	defer fixture.RemoveBuild()
	if _, err := fixture.Build(); err != nil {
		fmt.Fprintln(os.Stderr, "deploy:", err)
		return 1
	}
	return m.Run()
}

// needStack skips t under -short.
func needStack(t *testing.T) {
	t.Helper()
	if kube == nil {
		t.Skip("needs kube-apiserver, helm and kubectl; skipped under -short")
	}
}

// uniq returns prefix-<n>, unique in this test process.
func uniq(prefix string) string { return fmt.Sprintf("%s-%d", prefix, seq.Add(1)) }

// cmdResult is what a command printed and how it exited.
type cmdResult struct {
	stdout, stderr string
	code           int
}

// runCmd runs bin with args (a minute at most), with HOME-free helm
// directories and no CONSUL_* or KUBECONFIG from the test's environment.
func runCmd(t *testing.T, bin string, args ...string) cmdResult {
	t.Helper()
	return runCmdEnv(t, nil, bin, args...)
}

// runCmdEnv is runCmd with more environment variables.
func runCmdEnv(t *testing.T, env []string, bin string, args ...string) cmdResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute) // cleanups run it too
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	home := t.TempDir()
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + home,
		"HELM_CACHE_HOME=" + filepath.Join(home, "cache"), "HELM_CONFIG_HOME=" + filepath.Join(home, "config"),
		"HELM_DATA_HOME=" + filepath.Join(home, "data")}
	cmd.Env = append(cmd.Env, env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	res := cmdResult{stdout: out.String(), stderr: errb.String()}
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			res.code = ee.ExitCode()
		} else {
			t.Fatalf("%s %s: %v", filepath.Base(bin), strings.Join(args, " "), err)
		}
	}
	return res
}

// mustRun runs a command that must succeed and returns its stdout.
func mustRun(t *testing.T, bin string, args ...string) string {
	t.Helper()
	r := runCmd(t, bin, args...)
	if r.code != 0 {
		t.Fatalf("%s %s: exit %d\nstdout:\n%s\nstderr:\n%s", filepath.Base(bin), strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r.stdout
}

func helm(t *testing.T, args ...string) string {
	return mustRun(t, filepath.Join(tools, "helm"), args...)
}

func kubectl(t *testing.T, args ...string) string {
	return mustRun(t, filepath.Join(tools, "kubectl"), append([]string{"--kubeconfig", kube.KubeconfigPath}, args...)...)
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

var eventually = fixture.Eventually

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
