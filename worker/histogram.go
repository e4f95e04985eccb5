package worker

import "sort"

// Bucket bounds of the per-worker histograms: few buckets, because 10,000
// workers each export them.
var (
	LatencyBuckets   = []float64{0.005, 0.025, 0.1, 0.5, 1, 2.5, 10}
	CoalescedBuckets = []float64{1, 2, 5, 10, 50, 100}
)

// Histogram is a small fixed-bucket histogram a worker keeps for its own
// metrics (exported at scrape time, so a stopped worker leaves no series).
// It is not safe for concurrent use; the worker guards it with its mutex.
type Histogram struct {
	bounds []float64
	counts []uint64 // per bucket, not cumulative; len(bounds)+1 (the +Inf bucket)
	sum    float64
	count  uint64
}

// NewHistogram returns an empty histogram with the given upper bounds.
func NewHistogram(bounds []float64) Histogram {
	return Histogram{bounds: bounds, counts: make([]uint64, len(bounds)+1)}
}

// Observe adds v.
func (h *Histogram) Observe(v float64) {
	if h.counts == nil {
		return
	}
	i := sort.SearchFloat64s(h.bounds, v)
	h.counts[i]++
	h.sum += v
	h.count++
}

// Snapshot returns count, sum and cumulative counts by upper bound, the
// shape prometheus.MustNewConstHistogram takes.
func (h Histogram) Snapshot() (count uint64, sum float64, buckets map[float64]uint64) {
	buckets = make(map[float64]uint64, len(h.bounds))
	var cum uint64
	for i, b := range h.bounds {
		cum += h.counts[i]
		buckets[b] = cum
	}
	return h.count, h.sum, buckets
}

// clone returns a copy that shares nothing with h.
func (h Histogram) clone() Histogram {
	c := h
	c.counts = append([]uint64(nil), h.counts...)
	return c
}
