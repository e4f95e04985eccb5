package supervisor

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"
)

// TestReservedTags: the ids read are the reserved tags; a change calls
// changed once, an unchanged read does not.
func TestReservedTags(t *testing.T) {
	var r ReservedTags
	if _, ok := r.Lookup("west"); ok {
		t.Fatal("nothing read yet, but west is reserved")
	}
	reads := make(chan []string, 3)
	reads <- []string{"west", "north"}
	reads <- []string{"north", "west"}
	reads <- []string{"north"}
	var changes atomic.Int32
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	read := func(context.Context) ([]string, error) {
		select {
		case ids := <-reads:
			return ids, nil
		default:
			cancel()
			return nil, context.Canceled
		}
	}
	go func() {
		defer close(done)
		r.Run(ctx, time.Millisecond, read, func() { changes.Add(1) }, hclog.NewNullLogger())
	}()
	<-done
	if n := changes.Load(); n != 2 {
		t.Fatalf("%d changes, want 2 (the order of ids is not a change)", n)
	}
	if c, ok := r.Lookup("north"); !ok || c != "north" {
		t.Fatalf("north not reserved")
	}
	if _, ok := r.Lookup("west"); ok {
		t.Fatal("west still reserved after it went")
	}
}
