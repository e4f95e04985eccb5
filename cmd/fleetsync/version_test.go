package main

import (
	"bytes"
	"runtime"
	"runtime/debug"
	"testing"
)

func TestResolveVersion(t *testing.T) {
	info := func(mainVersion string, settings ...string) func() (*debug.BuildInfo, bool) {
		return func() (*debug.BuildInfo, bool) {
			bi := &debug.BuildInfo{Main: debug.Module{Path: "github.com/fleetsync/fleetsync", Version: mainVersion}}
			for i := 0; i+1 < len(settings); i += 2 {
				bi.Settings = append(bi.Settings, debug.BuildSetting{Key: settings[i], Value: settings[i+1]})
			}
			return bi, true
		}
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	const rev = "0123456789abcdef0123456789abcdef01234567"
	tests := []struct {
		name                    string
		stampedV, stampedC      string
		read                    func() (*debug.BuildInfo, bool)
		wantVersion, wantCommit string
	}{
		{name: "stamped by make build", stampedV: "v0.1.0-12-gabc1234-dirty", stampedC: rev,
			read: info("v9.9.9", "vcs.revision", "ffff"), wantVersion: "v0.1.0-12-gabc1234-dirty", wantCommit: rev},
		{name: "go install of a tag", read: info("v0.2.0"), wantVersion: "v0.2.0", wantCommit: "unknown"},
		{name: "go build in a checkout", read: info("v0.0.0-20261201160000-0123456789ab", "vcs", "git", "vcs.revision", rev, "vcs.modified", "false"),
			wantVersion: "v0.0.0-20261201160000-0123456789ab", wantCommit: rev},
		{name: "go build in a modified checkout", read: info("v0.0.0-20261201160000-0123456789ab+dirty", "vcs.revision", rev, "vcs.modified", "true"),
			wantVersion: "v0.0.0-20261201160000-0123456789ab+dirty", wantCommit: rev + "-dirty"},
		{name: "devel without vcs (go test, -buildvcs=false)", read: info("(devel)"), wantVersion: "dev", wantCommit: "unknown"},
		{name: "only the version stamped", stampedV: "v1.0.0", read: info("(devel)", "vcs.revision", rev), wantVersion: "v1.0.0", wantCommit: rev},
		{name: "no build info", read: none, wantVersion: "dev", wantCommit: "unknown"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v, c := resolveVersion(tt.stampedV, tt.stampedC, tt.read)
			if v != tt.wantVersion || c != tt.wantCommit {
				t.Errorf("resolveVersion = %q, %q; want %q, %q", v, c, tt.wantVersion, tt.wantCommit)
			}
		})
	}
}

// TestVersionFlag: --version prints the resolved version and commit (a
// test binary has no VCS stamp: dev, unknown) and the Go version, and
// exits 0 without a --cluster-id. The stamp of make build is checked on a
// built binary by test/repo's TestMakeBuildStampsVersion.
func TestVersionFlag(t *testing.T) {
	defer func(v, c string) { version, commit = v, c }(version, commit)
	for _, tt := range []struct{ version, commit, want string }{
		{version, commit, "fleetsync dev (commit unknown, " + runtime.Version() + ")\n"},
		{"v1.2.3", "abc", "fleetsync v1.2.3 (commit abc, " + runtime.Version() + ")\n"},
	} {
		version, commit = tt.version, tt.commit
		var out, errb bytes.Buffer
		if code := run([]string{"--version"}, &out, &errb); code != 0 || out.String() != tt.want || errb.Len() != 0 {
			t.Errorf("--version: code %d, stdout %q, stderr %q; want 0, %q", code, out.String(), errb.String(), tt.want)
		}
	}
}
