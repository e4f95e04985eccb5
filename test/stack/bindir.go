package stack

import (
	"fmt"
	"os"
	"path/filepath"
)

// Names of the binaries the stack runs, as test/tools/build.sh links them.
const (
	EtcdBin      = "etcd"
	APIServerBin = "kube-apiserver"
	ConsulBin    = "consul"
)

// BinDir returns the directory holding the test stack's binaries:
// $FLEETSYNC_TOOLS_BIN if set, else the bin dir of the tool cache,
// ${FLEETSYNC_TOOLS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fleetsync-tools}/bin,
// the same place test/tools/build.sh writes to. It fails, saying to run
// `make tools`, when etcd, kube-apiserver or consul is missing there.
func BinDir() (string, error) {
	dir, err := binDirPath()
	if err != nil {
		return "", err
	}
	for _, name := range []string{EtcdBin, APIServerBin, ConsulBin} {
		if err := checkExecutable(filepath.Join(dir, name)); err != nil {
			return "", fmt.Errorf("test stack binary %s: %w (run `make tools`, or set FLEETSYNC_TOOLS_BIN to the dir printed by test/tools/build.sh)", name, err)
		}
	}
	return dir, nil
}

func binDirPath() (string, error) {
	if d := os.Getenv("FLEETSYNC_TOOLS_BIN"); d != "" {
		return d, nil
	}
	cache := os.Getenv("FLEETSYNC_TOOLS_CACHE")
	if cache == "" {
		base := os.Getenv("XDG_CACHE_HOME")
		if base == "" {
			home, err := os.UserHomeDir()
			if err != nil {
				return "", fmt.Errorf("locating the tool cache: %w (set FLEETSYNC_TOOLS_BIN)", err)
			}
			base = filepath.Join(home, ".cache")
		}
		cache = filepath.Join(base, "fleetsync-tools")
	}
	return filepath.Join(cache, "bin"), nil
}

func checkExecutable(path string) error {
	fi, err := os.Stat(path) // follows the cache's symlinks
	if err != nil {
		return err
	}
	if fi.IsDir() || fi.Mode().Perm()&0o111 == 0 {
		return fmt.Errorf("%s is not an executable file", path)
	}
	return nil
}

// binPath resolves one binary: an explicit dir (options) wins, else BinDir.
func binPath(dir, name string) (string, error) {
	if dir == "" {
		var err error
		if dir, err = binDirPath(); err != nil {
			return "", err
		}
	}
	p := filepath.Join(dir, name)
	if err := checkExecutable(p); err != nil {
		return "", fmt.Errorf("test stack binary %s: %w (run `make tools`, or set FLEETSYNC_TOOLS_BIN to the dir printed by test/tools/build.sh)", name, err)
	}
	return p, nil
}
