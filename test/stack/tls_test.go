package stack

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net/http"
	"os"
	"testing"
)

// TestConsulTLS: with ConsulOptions.TLS the agent serves its API over HTTPS
// on HTTPSAddr, speaking HTTP/2 to a client that trusts the written CA and
// keeps plain HTTP; a restart keeps the HTTPS address.
func TestConsulTLS(t *testing.T) {
	files, err := WriteTLSFiles(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	c := ConsulOptionsT(t, ConsulOptions{TLS: &files})
	if c.HTTPSAddr == "" || c.HTTPSAddr == c.Addr {
		t.Fatalf("HTTPSAddr = %q (Addr %q); want a port of its own", c.HTTPSAddr, c.Addr)
	}
	caPEM, err := os.ReadFile(files.CA)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s: no certificate", files.CA)
	}
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}, ForceAttemptHTTP2: true}}
	t.Cleanup(client.CloseIdleConnections)
	leader := func() {
		t.Helper()
		resp, err := client.Get("https://" + c.HTTPSAddr + "/v1/status/leader")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
			t.Fatalf("GET /v1/status/leader over HTTPS: %s %s; want 200 over HTTP/2", resp.Proto, resp.Status)
		}
	}
	leader()
	if _, err := c.Client.Status().Leader(); err != nil {
		t.Fatalf("plain HTTP next to HTTPS: %v", err)
	}
	addr := c.HTTPSAddr
	if err := c.Restart(context.Background()); err != nil {
		t.Fatal(err)
	}
	if c.HTTPSAddr != addr {
		t.Fatalf("Restart moved HTTPSAddr %s -> %s", addr, c.HTTPSAddr)
	}
	client.CloseIdleConnections()
	leader()
}
