// Package repo checks the repository itself: no build output is tracked or
// can be added by accident, every documented build command writes its
// binary under bin/ or out/ (both ignored), make build stamps the
// version, make docs regenerates every generated doc, and README.md,
// docs/ and the Go files state what is true now, not history
// (docs_test.go). It needs git, make and the go command, and skips without
// a git checkout (a source tarball).
package repo

import (
	"bufio"
	"bytes"
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
)

// maxTrackedSize is the largest file the repository may track: its largest
// today (a tool module's go.sum) is 130 KB; the binaries once committed at
// the root were 45 and 48 MB.
const maxTrackedSize = 1 << 20

func root(t *testing.T) string {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	dir := filepath.Join(filepath.Dir(file), "..", "..")
	if _, err := os.Stat(filepath.Join(dir, ".git")); err != nil {
		t.Skipf("not a git checkout (%v)", err)
	}
	return dir
}

func command(t *testing.T, dir, name string, args ...string) []byte {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOTOOLCHAIN=local")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, stderr.Bytes())
	}
	return out
}

// ignored reports whether git ignores path (relative to the root).
func ignored(t *testing.T, dir, p string) bool {
	t.Helper()
	cmd := exec.Command("git", "check-ignore", "-q", "--no-index", p)
	cmd.Dir = dir
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &ee) && ee.ExitCode() == 1:
		return false
	default:
		t.Fatalf("git check-ignore %s: %v", p, err)
		return false
	}
}

// TestRootBuildOutputsIgnored: `go build ./<pkg>` at the root writes a
// binary named after the package's last path element; for every main
// package of the module that name is ignored, so a stray build cannot be
// committed (fleetsync and bench once were: 94 MB of a clone).
func TestRootBuildOutputsIgnored(t *testing.T) {
	dir := root(t)
	out := command(t, dir, "go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "./...")
	mains := strings.Fields(string(out))
	if len(mains) == 0 {
		t.Fatal("go list found no main package")
	}
	for _, pkg := range mains {
		name := path.Base(pkg)
		for _, p := range []string{name, name + ".exe", "bin/" + name, "out/" + name} {
			if !ignored(t, dir, p) {
				t.Errorf("%s (go build of %s) is not ignored: add /%s (and /*.exe) to .gitignore", p, pkg, name)
			}
		}
	}
	for _, p := range []string{"fleetsync.test", "cpu.prof"} {
		if !ignored(t, dir, p) {
			t.Errorf("%s is not ignored", p)
		}
	}
	// The rule is per name, not "everything at the root": these stay visible.
	for _, p := range []string{"LICENSE", "NOTICE", "go.work", "cmd/fleetsync/main.go"} {
		if ignored(t, dir, p) {
			t.Errorf("%s is ignored; only build outputs should be", p)
		}
	}
}

// TestNoTrackedBinaries: no tracked file is an executable binary (ELF,
// Mach-O, PE) or larger than maxTrackedSize.
func TestNoTrackedBinaries(t *testing.T) {
	dir := root(t)
	out := command(t, dir, "git", "ls-files", "-z")
	magics := [][]byte{
		{0x7f, 'E', 'L', 'F'},
		{0xfe, 0xed, 0xfa, 0xce}, {0xfe, 0xed, 0xfa, 0xcf}, {0xce, 0xfa, 0xed, 0xfe}, {0xcf, 0xfa, 0xed, 0xfe},
		{'M', 'Z'},
	}
	n := 0
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		f, err := os.Open(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		st, err := f.Stat()
		if err != nil {
			f.Close()
			t.Fatal(err)
		}
		head := make([]byte, 4)
		k, _ := f.Read(head)
		f.Close()
		n++
		if st.Size() > maxTrackedSize {
			t.Errorf("%s is tracked and %d bytes (limit %d): a build output or data that belongs outside the repository?", name, st.Size(), maxTrackedSize)
		}
		for _, m := range magics {
			if bytes.HasPrefix(head[:k], m) {
				t.Errorf("%s is tracked and an executable binary (starts %q): remove it (git rm --cached) and build into bin/", name, head[:k])
			}
		}
	}
	if n < 100 {
		t.Fatalf("only %d tracked files read", n)
	}
}

// buildCommand is a `go build` in a Makefile recipe, a script or a
// documented shell command.
var buildCommand = regexp.MustCompile(`(\$\(GO\)|\bgo) build\b`)

// TestBuildCommandsWriteToBinOrOut: every `go build` that the Makefile,
// the CI script or a doc runs or tells the reader to run names its output
// under bin/ or out/. (test/tools/build.sh builds the servers into the
// tool cache outside the checkout, and test/fixture into a temp dir; the
// image build in deploy/Dockerfile writes inside the build container.)
func TestBuildCommandsWriteToBinOrOut(t *testing.T) {
	dir := root(t)
	files := []string{"Makefile", "README.md", "deploy/README.md"}
	for _, glob := range []string{".ci/*", "docs/*.md"} {
		m, err := filepath.Glob(filepath.Join(dir, glob))
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range m {
			rel, _ := filepath.Rel(dir, f)
			files = append(files, rel)
		}
	}
	output := regexp.MustCompile(`\s-o\s+(bin|out)/`)
	seen := 0
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			t.Fatal(err)
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for line := 1; sc.Scan(); line++ {
			text := sc.Text()
			if !buildCommand.MatchString(text) {
				continue
			}
			seen++
			if !output.MatchString(text) {
				t.Errorf("%s:%d: %q builds without -o bin/... or -o out/... (at the root it would write a binary into the checkout)", name, line, strings.TrimSpace(text))
			}
		}
	}
	if seen == 0 {
		t.Error("no go build command found, not even make build's")
	}
}

// TestMakeBuildStampsVersion: the binary of make build prints, with
// --version, what git describe --always --dirty says of the checkout and
// the commit. It runs make build's own command (make -n), writing the
// binary into a temp dir instead of bin/.
func TestMakeBuildStampsVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds fleetsync")
	}
	dir := root(t)
	describe := strings.TrimSpace(string(command(t, dir, "git", "describe", "--always", "--dirty")))
	rev := strings.TrimSpace(string(command(t, dir, "git", "rev-parse", "HEAD")))
	var build string
	for _, line := range strings.Split(string(command(t, dir, "make", "-n", "build")), "\n") {
		if buildCommand.MatchString(line) {
			build = line
		}
	}
	if !strings.Contains(build, "-X main.version="+describe+" ") || !strings.Contains(build, "-X main.commit="+rev) {
		t.Fatalf("make build runs %q; want -X main.version=%s and -X main.commit=%s", build, describe, rev)
	}
	bin := filepath.Join(t.TempDir(), "fleetsync")
	if !strings.Contains(build, " -o bin/fleetsync ") {
		t.Fatalf("make build runs %q; want -o bin/fleetsync", build)
	}
	command(t, dir, "bash", "-c", strings.Replace(build, " -o bin/fleetsync ", " -o "+bin+" ", 1))
	out := string(command(t, dir, bin, "--version"))
	want := "fleetsync " + describe + " (commit " + rev + ", " + runtime.Version() + ")\n"
	if out != want {
		t.Errorf("fleetsync --version = %q, want %q", out, want)
	}
}

// TestMakeDocsRegeneratesEveryGeneratedDoc: every test that rewrites its
// doc when UPDATE_DOCS is set (docs/configuration.md, docs/metrics.md, and
// any added later) is run by make docs with UPDATE_DOCS=1.
func TestMakeDocsRegeneratesEveryGeneratedDoc(t *testing.T) {
	dir := root(t)
	type docTest struct{ pkg, name string }
	var tests []docTest
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if d.IsDir() {
			if rel == ".git" || rel == "test/tools" || strings.HasPrefix(d.Name(), ".") && rel != "." {
				return filepath.SkipDir // not this module's code
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, 0)
		if err != nil {
			return err
		}
		for _, decl := range f.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || !strings.HasPrefix(fn.Name.Name, "Test") || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING && lit.Value == `"UPDATE_DOCS"` {
					tests = append(tests, docTest{pkg: "./" + filepath.ToSlash(filepath.Dir(rel)), name: fn.Name.Name})
					return false
				}
				return true
			})
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(tests) < 2 {
		t.Fatalf("found %d tests that write a doc under UPDATE_DOCS, want at least TestConfigurationDoc and TestMetricsDoc: %v", len(tests), tests)
	}
	recipe := strings.Split(string(command(t, dir, "make", "-n", "docs")), "\n")
	for _, dt := range tests {
		found := false
		for _, line := range recipe {
			f := strings.Fields(line)
			if len(f) > 0 && f[0] == "UPDATE_DOCS=1" && strings.Contains(line, " test ") &&
				strings.Contains(line, "-run '^"+dt.name+"$'") && slices.Contains(f, dt.pkg) {
				found = true
			}
		}
		if !found {
			t.Errorf("make docs does not run %s in %s with UPDATE_DOCS=1; it runs:\n%s", dt.name, dt.pkg, strings.Join(recipe, "\n"))
		}
	}
}
