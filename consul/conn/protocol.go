package conn

import (
	"context"
	"fmt"
	"io"
	"net/http"
)

// SpeaksHTTP2 reports whether requests reach Consul over HTTP/2. Consul's
// HTTPS listener speaks it (its HTTP listener only HTTP/1.1), and
// limits.http_max_conns_per_client counts TCP connections, not the
// requests multiplexed on one: over HTTP/2 thousands of blocking queries
// share a few connections. It sends one request (/v1/status/leader, which
// needs no token) through the connection's transports and reads the
// protocol of the answer, whatever its status.
func (cn *Conn) SpeaksHTTP2(ctx context.Context) (bool, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cn.url+"/v1/status/leader", nil)
	if err != nil {
		return false, fmt.Errorf("consul protocol probe: %w", err)
	}
	resp, err := cn.cfg.HttpClient.Do(req)
	if err != nil {
		return false, fmt.Errorf("consul protocol probe: %w", err)
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxIdentityAnswer))
	return resp.ProtoMajor == 2, nil
}
