package repo

import (
	"bufio"
	"bytes"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// history matches what docs and comments must not say: sessions, rounds
// and run ids are history, which git keeps; docs and comments state what
// is true now (the same pattern as `grep -nE`, case as given).
var history = regexp.MustCompile(`session [0-9]|\bround\b|\bruns? [A-Z]{1,2}[0-9]?\b`)

// maxReadmeLines bounds README.md: what fleetsync is, the picture, the two
// commands, guarantees, figures and links; the rest lives in docs/.
const maxReadmeLines = 160

// TestDocsAndCommentsNameNoHistory: README.md, every file under docs/ and
// every tracked .go file are free of session numbers, rounds and run ids.
func TestDocsAndCommentsNameNoHistory(t *testing.T) {
	dir := root(t)
	files := []string{"README.md"}
	err := filepath.WalkDir(filepath.Join(dir, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		files = append(files, filepath.ToSlash(rel))
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	out := command(t, dir, "git", "ls-files", "-z", "--", "*.go")
	for _, name := range strings.Split(strings.TrimRight(string(out), "\x00"), "\x00") {
		if name != "" {
			files = append(files, name)
		}
	}
	read := 0
	for _, name := range files {
		b, err := os.ReadFile(filepath.Join(dir, name))
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet committed
		}
		if err != nil {
			t.Fatal(err)
		}
		read++
		for i, line := range bytes.Split(b, []byte("\n")) {
			if m := history.Find(line); m != nil {
				t.Errorf("%s:%d: %q names history (%q): say what is true now, and leave sessions, rounds and runs to git", name, i+1, strings.TrimSpace(string(line)), m)
			}
		}
	}
	if read < 100 {
		t.Fatalf("only %d files read", read)
	}
}

// TestReadmeIsShort: README.md is at most maxReadmeLines lines.
func TestReadmeIsShort(t *testing.T) {
	dir := root(t)
	f, err := os.Open(filepath.Join(dir, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	n := 0
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		n++
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if n > maxReadmeLines {
		t.Errorf("README.md has %d lines, want at most %d: move the detail into docs/ and link it", n, maxReadmeLines)
	}
}
