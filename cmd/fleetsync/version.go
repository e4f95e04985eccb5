package main

import "runtime/debug"

// version and commit are stamped by `make build` (-ldflags "-X
// main.version=$(git describe --always --dirty) -X main.commit=...") and by
// the image build (deploy/Dockerfile). Unstamped (go build, go install),
// init takes them from the build info Go records; see resolveVersion.
var (
	version string
	commit  string
)

func init() {
	version, commit = resolveVersion(version, commit, debug.ReadBuildInfo)
}

// resolveVersion returns the stamped version and commit where set, else
// the build info's: the main module's version (a tag, or since Go 1.24 a
// pseudo-version from the checkout, "+dirty" when modified) and the VCS
// revision ("-dirty" appended when the tree was modified). Without either
// it is "dev" and "unknown".
func resolveVersion(stampedVersion, stampedCommit string, read func() (*debug.BuildInfo, bool)) (string, string) {
	v, c := stampedVersion, stampedCommit
	if v != "" && c != "" {
		return v, c
	}
	if bi, ok := read(); ok && bi != nil {
		if mv := bi.Main.Version; v == "" && mv != "" && mv != "(devel)" {
			v = mv
		}
		var rev string
		var modified bool
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				rev = s.Value
			case "vcs.modified":
				modified = s.Value == "true"
			}
		}
		if c == "" && rev != "" {
			c = rev
			if modified {
				c += "-dirty"
			}
		}
	}
	if v == "" {
		v = "dev"
	}
	if c == "" {
		c = "unknown"
	}
	return v, c
}
