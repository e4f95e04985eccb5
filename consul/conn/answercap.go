package conn

import (
	"fmt"
	"io"
	"net/http"

	"github.com/fleetsync/fleetsync/consul/internal/wire"
)

// maxAnswer bounds the body of every answer read through a Dial
// connection: the reads through consul/api (the claim's KV reads and
// sessions, the blocking queries of the Consul -> Kubernetes direction)
// have no bound of their own, so an endless answer would be read whole
// into memory. The catalog store's raw reads stop at their own bound,
// wire.DefaultMaxAnswer, with a clearer error; this one is a byte more,
// so theirs is met first.
const maxAnswer = wire.DefaultMaxAnswer + 1

// cappedTransport makes a body longer than max an error once max bytes
// of it are read.
type cappedTransport struct {
	base http.RoundTripper
	max  int64
}

func (t cappedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err == nil && resp.Body != nil {
		resp.Body = &cappedBody{ReadCloser: resp.Body, left: t.max, max: t.max, path: req.URL.Path}
	}
	return resp, err
}

type cappedBody struct {
	io.ReadCloser
	left, max int64
	path      string
}

func (b *cappedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		var one [1]byte
		if n, err := b.ReadCloser.Read(one[:]); n == 0 {
			return 0, err
		}
		return 0, fmt.Errorf("consul answer to %s: over %d bytes, read no further", b.path, b.max)
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}
