package loss

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/fleetsync/fleetsync/consul"
)

// TestThawedReplicaJudgesOnlyWhatItStillSyncs: a replica stopped longer
// than its shard Lease (the fake clock jumps 30 s, twice a 15 s Lease)
// finds the entries it witnessed rewritten: by the replica that took the
// shard meanwhile, which is no loss, or, in a shard it still holds, by a
// Consul that lost them, which is. Before a witness not as we left it is
// judged, Confirm makes the Store forget the Services handed over; a
// Confirm that cannot tell leaves the judgement to the next check; a check
// that finds every witness as left asks nothing.
func TestThawedReplicaJudgesOnlyWhatItStillSyncs(t *testing.T) {
	for _, tc := range []struct {
		name       string
		gone       []string // entries not as we left them after the gap
		confirm    bool     // Config.Confirm set
		lostPrefix string   // what Confirm makes the Store forget ("": nothing)
		confirmErr bool     // the first Confirm cannot tell
		want       []string // signals after the gap
		confirms   int
	}{
		{name: "the taken shard's entries rewritten: no loss", gone: []string{"taken-1"}, confirm: true, lostPrefix: "taken-", confirms: 1},
		{name: "a held shard's entry gone as well: a loss", gone: []string{"taken-1", "held-1"}, confirm: true, lostPrefix: "taken-", want: []string{SignalEntryLost}, confirms: 1},
		{name: "the shard still held: a loss", gone: []string{"taken-1"}, confirm: true, want: []string{SignalEntryLost}, confirms: 1},
		{name: "without Confirm: judged at once", gone: []string{"taken-1"}, want: []string{SignalEntryLost}},
		{name: "Confirm cannot tell: judged at the next check", gone: []string{"taken-1"}, confirm: true, lostPrefix: "taken-", confirmErr: true, confirms: 2},
		{name: "every witness as left: nothing asked", confirm: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(epoch)
			store := aQuietStore()
			// held-1 is the older witness, taken-1 the newest: a check
			// reads taken-1 first, and held-1 once taken-1 is forgotten.
			held := consul.Witness{Node: "k8s-a", ID: "held-1", Name: "s0", Index: 50, At: epoch.Add(-2 * time.Second)}
			taken := consul.Witness{Node: "k8s-a", ID: "taken-1", Name: "s1", Index: 51, At: epoch.Add(-time.Second)}
			store.edit(func(s *fakeStore) {
				s.ws = []consul.Witness{held, taken}
				s.entries["held-1"], s.entries["taken-1"] = 50, 51
				s.committed["k8s-a"], s.index["k8s-a"], s.marks = 51, 51, consul.CatalogMarks{Nodes: 51, Checks: 52}
			})
			confirms := 0
			w, o := newWatch(store, clk, "")
			if tc.confirm {
				w.cfg.Confirm = func(context.Context) error {
					confirms++
					if tc.confirmErr && confirms == 1 {
						return errors.New("the API server does not answer")
					}
					if tc.lostPrefix != "" {
						store.ForgetWitnesses(tc.lostPrefix)
					}
					return nil
				}
			}
			w.Step(t.Context(), "")
			if sig, _ := o.get(); len(sig) != 0 || confirms != 0 {
				t.Fatalf("before the gap: signals %v, %d confirms", sig, confirms)
			}
			// Stopped past the Lease: another replica took the shard and
			// wrote newer states (taken-1 deleted, a new entry), or
			// Consul lost held-1; the catalog's marks moved.
			clk.Step(30 * time.Second)
			store.edit(func(s *fakeStore) {
				for _, id := range tc.gone {
					delete(s.entries, id)
				}
				s.marks, s.index["k8s-a"] = consul.CatalogMarks{Nodes: 60, Checks: 61}, 60
			})
			w.Step(t.Context(), "")
			if tc.confirmErr {
				if sig, _ := o.get(); len(sig) != 0 {
					t.Fatalf("signals %v from a check whose Confirm could not tell", sig)
				}
				clk.Step(time.Second)
				w.Step(t.Context(), "")
			}
			if sig, _ := o.get(); !slices.Equal(sig, tc.want) || confirms != tc.confirms {
				t.Fatalf("after the gap: signals %v, %d confirms; want %v, %d", sig, confirms, tc.want, tc.confirms)
			}
		})
	}
}

// TestWorkersEvidenceJudgedAfterConfirm: a worker of a shard another
// replica took while this one was stopped sees that replica's writes and
// reports them; once Confirm ran, its evidence no longer stands (its shard
// is gone here) and is no loss. Evidence that stands is a loss; evidence
// that cannot be confirmed waits for the next check.
func TestWorkersEvidenceJudgedAfterConfirm(t *testing.T) {
	for _, tc := range []struct {
		name       string
		reports    []string // "taken" or "held": the reporting worker's shard
		confirmErr bool     // the first Confirm cannot tell
		want       []string
	}{
		{name: "a worker of the taken shard: no loss", reports: []string{"taken"}},
		{name: "a worker of a held shard: a loss", reports: []string{"held"}, want: []string{SignalWorker}},
		{name: "both: a loss", reports: []string{"taken", "held"}, want: []string{SignalWorker}},
		{name: "Confirm cannot tell: judged at the next check", reports: []string{"held"}, confirmErr: true, want: []string{SignalWorker}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := clocktesting.NewFakeClock(epoch)
			store := aQuietStore()
			w, o := newWatch(store, clk, "")
			w.Step(t.Context(), "")
			taken := false // the shard handed over, as Confirm finds
			confirms := 0
			w.cfg.Confirm = func(context.Context) error {
				confirms++
				if tc.confirmErr && confirms == 1 {
					return errors.New("the API server does not answer")
				}
				taken = true
				return nil
			}
			clk.Step(30 * time.Second)
			for _, r := range tc.reports {
				stands := func() bool { return true }
				if r == "taken" {
					stands = func() bool { return !taken }
				}
				w.Report("service ns/"+r+": 2 of 2 entries gone", stands)
			}
			w.check(t.Context())
			if tc.confirmErr {
				if sig, _ := o.get(); len(sig) != 0 {
					t.Fatalf("signals %v from evidence that could not be confirmed", sig)
				}
				clk.Step(time.Second)
				w.check(t.Context())
			}
			if sig, _ := o.get(); !slices.Equal(sig, tc.want) {
				t.Fatalf("signals %v, want %v", sig, tc.want)
			}
		})
	}
}
