package stack

import (
	"fmt"
	"os"
	"path/filepath"
)

// TLSFiles are the PEM files of a throwaway CA and of a server certificate
// it signed for 127.0.0.1, localhost and server.dc1.consul.
type TLSFiles struct {
	CA, Cert, Key string
}

// WriteTLSFiles writes a fresh throwaway CA (ca.pem) and a server
// certificate (server.pem, server-key.pem) into dir.
func WriteTLSFiles(dir string) (TLSFiles, error) {
	c, err := newServingCert()
	if err != nil {
		return TLSFiles{}, fmt.Errorf("throwaway CA: %w", err)
	}
	f := TLSFiles{CA: filepath.Join(dir, "ca.pem"), Cert: filepath.Join(dir, "server.pem"), Key: filepath.Join(dir, "server-key.pem")}
	for path, data := range map[string][]byte{f.CA: c.caPEM, f.Cert: c.certPEM, f.Key: c.keyPEM} {
		if err := os.WriteFile(path, data, 0o600); err != nil {
			return TLSFiles{}, err
		}
	}
	return f, nil
}

// consulHCL is the agent configuration that serves HTTPS with f, without
// verifying clients (a client needs only the CA).
func (f TLSFiles) consulHCL() string {
	return fmt.Sprintf(`tls { defaults { ca_file = %q cert_file = %q key_file = %q verify_incoming = false } }`, f.CA, f.Cert, f.Key)
}
