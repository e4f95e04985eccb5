package wire

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"

	"github.com/hashicorp/consul/api"
)

// Raw sends the reads of owned state and the transactions (write)
// itself, through the daemon's own HTTP client (its token and failover
// transports), and decodes each answer from one pooled buffer. consul/api decodes through a json.Decoder that
// grows a fresh buffer for every answer: at 10,000 Services x 10 that was
// 40 % of everything the daemon allocated (1 GB over a cold start and the
// first resync period), and the garbage collector's work with
// it. The request is the one consul/api would send (rawQuery, pinned by
// TestRawReadsAskWhatTheAPIClientAsks and TestRawTxnSendsWhatTheAPIClientSends);
// the answer is decoded into the same lean types (decode).
type Raw struct {
	hc     *http.Client
	scheme string
	host   string
	prefix string // api.Config.PathPrefix
	dc     string
	token  string             // a static token (the token transport, if any, overrides it)
	auth   *api.HttpBasicAuth // CONSUL_HTTP_AUTH, as consul/api sends it
	// MaxAnswer bounds the body of an answer (0: DefaultMaxAnswer); a
	// longer one is an error, read no further.
	MaxAnswer int64
}

// NewRaw returns the raw reads of the consul/api client built from
// cfg (api.NewClient completes cfg: scheme, address, HTTP client), or nil
// when they cannot be sent the same way (no HTTP client yet, or a Unix
// socket): the reads then go through consul/api.
func NewRaw(cfg *api.Config) *Raw {
	if cfg == nil || cfg.HttpClient == nil || (cfg.Scheme != "http" && cfg.Scheme != "https") ||
		cfg.Address == "" || strings.Contains(cfg.Address, "://") || strings.HasPrefix(cfg.Address, "/") {
		return nil
	}
	return &Raw{hc: cfg.HttpClient, scheme: cfg.Scheme, host: cfg.Address, prefix: cfg.PathPrefix, dc: cfg.Datacenter, token: cfg.Token, auth: cfg.HttpAuth}
}

// rawQuery is the URL and header consul/api sends for a GET of path with
// q (its newRequest and setQueryOptions, for the options fleetsync sets).
func (r *Raw) rawQuery(path string, q *api.QueryOptions) (*url.URL, http.Header) {
	params := url.Values{}
	header := http.Header{}
	if r.dc != "" {
		params.Set("dc", r.dc)
	}
	if r.token != "" {
		header.Set("X-Consul-Token", r.token)
	}
	if q.Namespace != "" {
		params.Set("ns", q.Namespace)
	}
	if q.Partition != "" {
		params.Set("partition", q.Partition)
	}
	if q.Datacenter != "" {
		params.Set("dc", q.Datacenter)
	}
	if q.AllowStale {
		params.Set("stale", "")
	}
	if q.RequireConsistent {
		params.Set("consistent", "")
	}
	if q.WaitIndex != 0 {
		params.Set("index", strconv.FormatUint(q.WaitIndex, 10))
	}
	if q.WaitTime != 0 {
		params.Set("wait", fmt.Sprintf("%dms", max(q.WaitTime.Milliseconds(), 1)))
	}
	if q.Token != "" {
		header.Set("X-Consul-Token", q.Token)
	}
	if q.Filter != "" {
		params.Set("filter", q.Filter)
	}
	for k, v := range q.NodeMeta {
		params.Add("node-meta", k+":"+v)
	}
	return &url.URL{Scheme: r.scheme, Host: r.host, Path: r.prefix + path, RawQuery: params.Encode()}, header
}

// bufs holds the answers' buffers between reads.
var bufs = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// maxPooled: a buffer grown past this by one huge answer is not kept.
const maxPooled = 4 << 20

// query GETs path and decodes the answer into out, as consul/api's Query
// does: a status other than 200 is an api.StatusError.
func (r *Raw) query(path string, out any, q *api.QueryOptions) (*api.QueryMeta, error) {
	u, header := r.rawQuery(path, q)
	h, err := r.do(q.Context(), http.MethodGet, u, header, nil, out)
	if err != nil {
		return nil, err
	}
	meta := &api.QueryMeta{}
	if s := h.Get("X-Consul-Index"); s != "" {
		if meta.LastIndex, err = strconv.ParseUint(s, 10, 64); err != nil {
			return nil, fmt.Errorf("parse X-Consul-Index: %w", err)
		}
	}
	meta.KnownLeader = h.Get("X-Consul-KnownLeader") == "true"
	return meta, nil
}

// write PUTs body (JSON) to path and decodes the answer into out, as
// consul/api's Write does with the write options of q (namespace,
// partition, datacenter, token): the URL and headers of rawQuery for
// those alone, and consul/api's Content-Type.
func (r *Raw) write(path string, body []byte, out any, q *api.QueryOptions) error {
	u, header := r.rawQuery(path, &api.QueryOptions{Namespace: q.Namespace, Partition: q.Partition, Datacenter: q.Datacenter, Token: q.Token})
	header.Set("Content-Type", "application/json; charset=utf-8")
	_, err := r.do(q.Context(), http.MethodPut, u, header, body, out)
	return err
}

// do sends one request and decodes a 200 answer, read into a pooled
// buffer, into out; it returns the answer's headers. Another status is an
// api.StatusError with the answer as its body, as consul/api makes it.
func (r *Raw) do(ctx context.Context, method string, u *url.URL, header http.Header, body []byte, out any) (http.Header, error) {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	req.Header = header
	if r.auth != nil {
		req.SetBasicAuth(r.auth.Username, r.auth.Password)
	}
	resp, err := r.hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer func() {
		// What is left of a short answer is read so that the connection
		// is kept; a longer rest closes it.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
		resp.Body.Close()
	}()
	buf := bufs.Get().(*bytes.Buffer)
	buf.Reset()
	defer func() {
		if buf.Cap() <= maxPooled {
			bufs.Put(buf)
		}
	}()
	limit := r.MaxAnswer
	if limit <= 0 {
		limit = DefaultMaxAnswer
	}
	n, err := buf.ReadFrom(io.LimitReader(resp.Body, limit+1))
	switch {
	case err != nil:
		return nil, answerError(method, u.Path, "read the answer", err)
	case n > limit:
		return nil, answerError(method, u.Path, fmt.Sprintf("the answer is over %d bytes", limit), nil)
	case resp.StatusCode != http.StatusOK:
		return nil, api.StatusError{Code: resp.StatusCode, Body: strings.TrimSpace(buf.String())}
	}
	if err := decode(buf.Bytes(), out); err != nil {
		return nil, answerError(method, u.Path, notJSON(resp.Header), err)
	}
	if where := checkAnswer(out); where != "" {
		return nil, answerError(method, u.Path, where, nil)
	}
	return resp.Header, nil
}
