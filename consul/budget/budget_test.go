package budget

import (
	"context"
	"testing"
	"time"
)

func TestNilBudgetAllowsEverything(t *testing.T) {
	if b := New(0, 0, 0); b != nil {
		t.Fatalf("New(0,0,0) = %v, want nil", b)
	}
	var b *Budget
	p, err := b.Acquire(context.Background(), false)
	if err != nil {
		t.Fatal(err)
	}
	p.Release()
}

// TestHighPriorityGoesFirst: with one inflight slot held, a bulk caller that
// queued first still waits until a later high-priority caller is served.
func TestHighPriorityGoesFirst(t *testing.T) {
	b := New(0, 0, 1)
	ctx := t.Context()
	held, err := b.Acquire(ctx, false)
	if err != nil {
		t.Fatal(err)
	}
	order := make(chan string, 2)
	bulkQueued := make(chan struct{})
	go func() {
		close(bulkQueued)
		p, err := b.Acquire(ctx, false)
		if err == nil {
			order <- "bulk"
			p.Release()
		}
	}()
	<-bulkQueued
	highIn := make(chan struct{})
	go func() {
		b.enterHigh() // registered as waiting before it queues for the slot
		close(highIn)
		defer b.leaveHigh()
		if err := b.sem.Acquire(ctx, 1); err == nil {
			order <- "high"
			b.sem.Release(1)
		}
	}()
	<-highIn
	held.Release()
	first := <-order
	second := <-order
	if first != "high" || second != "bulk" {
		t.Fatalf("order = %s, %s; want high, bulk", first, second)
	}
}

func TestAcquireHonoursContext(t *testing.T) {
	b := New(0, 0, 1)
	held, _ := b.Acquire(context.Background(), true)
	defer held.Release()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	if _, err := b.Acquire(ctx, false); err == nil {
		t.Fatal("Acquire succeeded with the only slot held")
	}
}
