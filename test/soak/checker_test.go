package main

import (
	"bytes"
	"slices"
	"strings"
	"testing"
	"time"
)

// judged feeds readings to a checker, each at its own time.
type judged struct {
	t   *testing.T
	c   *checker
	t0  time.Time
	log bytes.Buffer
}

func newJudged(t *testing.T) *judged {
	j := &judged{t: t, t0: time.Unix(1_000_000, 0)}
	j.c = newChecker(&world{start: j.t0, logw: &j.log}, 30*time.Second)
	return j
}

// at judges a reading that began at `began` seconds and ended at `ended`.
func (j *judged) at(began, ended float64, desired []key, present map[key]int) {
	r := &reading{At: j.t0.Add(time.Duration(began * float64(time.Second))), Desired: map[key]bool{}, Present: map[key][]entry{}}
	for _, k := range desired {
		r.Desired[k] = true
	}
	for k, n := range present {
		for i := range n {
			r.Present[k] = append(r.Present[k], entry{Node: "k8s-alpha", ID: k.String() + string(rune('a'+i)), Marked: k.Cluster, Key: k})
		}
	}
	j.c.mu.Lock()
	defer j.c.mu.Unlock()
	j.c.judge(r, nil, 0, 0, j.t0.Add(time.Duration(ended*float64(time.Second))))
}

func (j *judged) rules() []string {
	var out []string
	for _, v := range j.c.violations {
		out = append(out, v.Rule)
	}
	return out
}

// TestCheckerFlagsADuplicatePastTheBound: an endpoint registered twice by
// its cluster is not exact, and a violation once it outlives the bound.
func TestCheckerFlagsADuplicatePastTheBound(t *testing.T) {
	j := newJudged(t)
	k := key{"alpha", "svc-001", "10.10.0.1", 8080}
	j.at(1, 1.1, []key{k}, map[key]int{k: 2})
	if ok, _ := j.c.exact(); ok {
		t.Error("exact with an instance registered twice")
	}
	j.at(20, 20.1, []key{k}, map[key]int{k: 2})
	if got := j.rules(); len(got) != 0 {
		t.Fatalf("violations %v within the bound, want none", got)
	}
	j.at(32, 32.1, []key{k}, map[key]int{k: 2})
	if got := j.rules(); !slices.Equal(got, []string{"instance-duplicate"}) {
		t.Fatalf("violations %v past the bound, want [instance-duplicate]", got)
	}
	j.at(33, 33.1, []key{k}, map[key]int{k: 1})
	if ok, _ := j.c.exact(); !ok {
		t.Error("not exact once the duplicate is gone")
	}
}

// TestCheckerExactOnlyAfterAReadingBegunAfterTheHeal: a reading begun
// before a heal says nothing of what the heal changed.
func TestCheckerExactOnlyAfterAReadingBegunAfterTheHeal(t *testing.T) {
	j := newJudged(t)
	k := key{"alpha", "svc-001", "10.10.0.1", 8080}
	healed := j.t0.Add(10 * time.Second)
	j.at(9.9, 10.2, []key{k}, map[key]int{k: 1}) // began before the heal, ended after it
	if ok, _ := j.c.exact(); !ok {
		t.Fatal("the reading was exact")
	}
	if j.c.exactAfter(healed) {
		t.Error("exactAfter(heal) true from a reading that began before the heal")
	}
	j.at(10.5, 10.6, []key{k}, map[key]int{k: 1})
	if !j.c.exactAfter(healed) {
		t.Error("exactAfter(heal) false after an exact reading begun after it")
	}
	j.at(11, 11.1, []key{k}, nil) // the heal's effect shows: k missing
	if j.c.exactAfter(healed) {
		t.Error("exactAfter(heal) true while an instance is missing")
	}
}

// TestCheckerWantsTheCurrentValues: an instance left with the meta of an
// older revision of its Service is an update not propagated: missing, and
// a violation once that outlives the bound; the current one ends it.
func TestCheckerWantsTheCurrentValues(t *testing.T) {
	j := newJudged(t)
	k := key{"alpha", "svc-001", "10.10.0.1", 8080}
	read := func(at float64, have string) {
		r := &reading{At: j.t0.Add(time.Duration(at * float64(time.Second))), Desired: map[key]bool{k: true},
			Rev: map[key]string{k: "2"}, Present: map[key][]entry{k: {{Node: "k8s-alpha", ID: "a", Marked: "alpha", Key: k, Rev: have}}}}
		j.c.mu.Lock()
		defer j.c.mu.Unlock()
		j.c.judge(r, nil, 0, 0, r.At)
	}
	read(1, "1")
	if ok, _ := j.c.exact(); ok {
		t.Error("exact with the instance at rev 1, rev 2 wanted")
	}
	read(32, "1")
	if got := j.rules(); !slices.Equal(got, []string{"instance-missing"}) {
		t.Fatalf("violations %v with rev 1 past the bound, want [instance-missing]", got)
	}
	read(33, "2")
	if ok, _ := j.c.exact(); !ok {
		t.Error("not exact with the current rev")
	}
}

// TestCheckerNamesWhatHoldsAMissingInstance: a missing-instance violation
// says what Consul holds at the instance's address and port on its
// cluster's nodes (someone else's entry under its ID, here), and only
// there.
func TestCheckerNamesWhatHoldsAMissingInstance(t *testing.T) {
	j := newJudged(t)
	j.c.w.clusters = []*cluster{{id: "alpha"}}
	k := key{"alpha", "svc-077", "10.10.0.193", 8080}
	id := "k8s_alpha_soak-alpha_svc-077_10.10.0.193_8080"
	entries := map[string]entry{
		"k8s-alpha.1/" + id:                 {Node: "k8s-alpha.1", ID: id, ModifyIndex: 42, Desc: "svc-077 10.10.0.193:8080 tags [tampered]"},
		"vm-legacy/legacy_10.10.0.193_8080": {Node: "vm-legacy", ID: "legacy_10.10.0.193_8080", Desc: "not alpha's node"},
		"k8s-alpha/k8s_alpha_other_10.10.0.19_8080": {Node: "k8s-alpha", ID: "k8s_alpha_other_10.10.0.19_8080",
			Desc: "another address"},
	}
	for _, s := range []float64{1, 32} {
		r := &reading{At: j.t0.Add(time.Duration(s * float64(time.Second))), Desired: map[key]bool{k: true}, Present: map[key][]entry{}, Entries: entries}
		j.c.mu.Lock()
		j.c.judge(r, nil, 0, 0, r.At)
		j.c.mu.Unlock()
	}
	if len(j.c.violations) != 1 || j.c.violations[0].Rule != "instance-missing" {
		t.Fatalf("violations %+v, want one instance-missing", j.c.violations)
	}
	want := "; Consul holds at its address and port: k8s-alpha.1/" + id + " at index 42 (unmarked): svc-077 10.10.0.193:8080 tags [tampered]"
	if d := j.c.violations[0].Detail; !strings.HasSuffix(d, want) {
		t.Fatalf("detail %q\ndoes not end with %q", d, want)
	}
}

// TestCheckerGivesAThawedReplicaThawGrace: a Service run by two replicas
// in two samples in a row is a violation, unless one of them was thawed
// less than thawGrace ago (it drops the shards it lost within it); past
// the grace it is one again.
func TestCheckerGivesAThawedReplicaThawGrace(t *testing.T) {
	j := newJudged(t)
	both := map[string][]string{"alpha/svc-001": {"alpha-0", "alpha-1"}}
	sample := func(at float64) {
		r := &reading{At: j.t0.Add(time.Duration(at * float64(time.Second))), Desired: map[key]bool{}, Present: map[key][]entry{}}
		j.c.mu.Lock()
		defer j.c.mu.Unlock()
		j.c.judge(r, both, 0, 0, r.At)
	}
	j.c.thawed("alpha-1", j.t0.Add(10*time.Second))
	sample(10.5)
	sample(11)
	sample(21.5)
	if got := j.rules(); len(got) != 0 {
		t.Fatalf("violations %v within %s of the thaw, want none", got, thawGrace)
	}
	sample(22.5)
	sample(23)
	if got := j.rules(); !slices.Equal(got, []string{"one-replica"}) {
		t.Fatalf("violations %v past the grace, want [one-replica]", got)
	}
	j = newJudged(t)
	sample(1)
	sample(1.5)
	if got := j.rules(); !slices.Equal(got, []string{"one-replica"}) {
		t.Fatalf("violations %v with no thaw, want [one-replica]", got)
	}
}
