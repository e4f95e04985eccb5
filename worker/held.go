package worker

import (
	"hash/maphash"
	"math/bits"
	"unique"

	"github.com/fleetsync/fleetsync/consul"
	"github.com/fleetsync/fleetsync/ownership"
)

// Held is what a worker keeps of an entry it owns: the fields its diffs,
// CAS writes and deletes read, and a digest of the rest (address, port,
// weight, tags and meta). An entry held whole cost ~0.6 KiB, most of it
// its meta map; a Held costs ~0.15 KiB, which at 10,000 Services x 10 is
// ~45 MiB less heap. Entries become Held only once
// verified as ours (OwnedOf) or written by us (merge).
type Held struct {
	ID           string
	Name         string // Consul service name
	Node         string
	Namespace    string // Consul namespace (Enterprise; "" for the default)
	Check        consul.Check
	ServiceIndex uint64
	CheckIndex   uint64
	HasCheck     bool
	sum          digest
}

// Hold keeps what a worker needs of r. The strings many entries share
// (name, node, namespace, check status and output) are interned: an entry
// read from Consul has its own decoded copy of each, ~70 bytes.
func Hold(r consul.Registered) Held {
	return Held{ID: r.ID, Name: intern(r.Name), Node: intern(r.Node), Namespace: intern(r.Namespace),
		Check:        consul.Check{Status: intern(r.Check.Status), Output: intern(r.Check.Output)},
		ServiceIndex: r.ServiceIndex, CheckIndex: r.CheckIndex, HasCheck: r.HasCheck, sum: sumOf(r.Instance)}
}

// intern returns the one copy of s (package unique).
func intern(s string) string {
	if s == "" {
		return ""
	}
	return unique.Make(s).Value()
}

// Is reports whether in is the instance h holds, in every field Consul
// stores (consul.Instance.Equal of the entry h was made from).
func (h Held) Is(in consul.Instance) bool {
	return h.ID == in.ID && h.Name == in.Name && h.Check == in.Check && h.sum == sumOf(in)
}

// Mark is a cluster's ownership mark: the meta and tags every entry it
// owns carries (ownership.Cluster.Stamp of an empty instance).
type Mark struct {
	Meta map[string]string
	Tags []string
}

// MarkOf returns cluster's mark.
func MarkOf(cluster ownership.Cluster) Mark {
	in := cluster.Stamp(consul.Instance{})
	return Mark{Meta: in.Meta, Tags: in.Tags}
}

// Registered returns h as the consul writer takes an entry to update or
// delete: ID, name, node, namespace, check and indexes as held, and the
// cluster's mark as its only meta and tags (the meta map and tags are
// mark's own: read, never written). The writer's ownership check on it
// therefore checks the node only: the entry's own mark was checked when
// it was read (OwnedOf, GroupOwned) or came from our write (merge), the
// only ways into a worker's held entries.
func (h Held) Registered(mark Mark) consul.Registered {
	return consul.Registered{
		Instance: consul.Instance{ID: h.ID, Name: h.Name, Check: h.Check, Meta: mark.Meta, Tags: mark.Tags},
		Node:     h.Node, Namespace: h.Namespace, ServiceIndex: h.ServiceIndex, CheckIndex: h.CheckIndex, HasCheck: h.HasCheck,
	}
}

// digest is a 128-bit hash of an instance's address, port, weight, tags
// (in order) and meta (in any order), under two seeds of this process. It
// never leaves the process, so the seeds need not be stable; two
// different instances share one with odds of about 2^-128.
type digest struct{ a, b uint64 }

var digestSeeds = [2]maphash.Seed{maphash.MakeSeed(), maphash.MakeSeed()}

// sumOf hashes every string on its own (maphash.String: no copy, no
// stream) and folds the hashes in order (fold); each meta pair folds, key
// then value, to one value and the pairs are added, so their order does
// not count. nil and empty tags (or meta) are the same, as in
// Instance.Equal.
func sumOf(in consul.Instance) digest {
	var out [2]uint64
	for i, seed := range digestSeeds {
		x := fold(fold(fold(uint64(len(in.Tags)), maphash.String(seed, in.Address)), uint64(int64(in.Port))), uint64(int64(in.Weight)))
		for _, t := range in.Tags {
			x = fold(x, maphash.String(seed, t))
		}
		var meta uint64
		for k, v := range in.Meta {
			meta += fold(fold(1, maphash.String(seed, k)), maphash.String(seed, v))
		}
		out[i] = finish(fold(fold(x, uint64(len(in.Meta))), meta))
	}
	return digest{out[0], out[1]}
}

// fold mixes v into x: an xor, a multiplication by an odd number and a
// rotation, so for a given v a bijection of x, and not symmetric in x and
// v once x itself was folded.
func fold(x, v uint64) uint64 {
	return bits.RotateLeft64((x^v)*0x9e3779b97f4a7c15, 31)
}

// finish is murmur3's 64-bit finaliser.
func finish(x uint64) uint64 {
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	x *= 0xc4ceb9fe1a85ec53
	x ^= x >> 33
	return x
}
