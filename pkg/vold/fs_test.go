package vold

import (
	"context"
	"testing"
	"time"
)

// TestInterruptedOpGoesOn: a FUSE interrupt (the caller got a signal)
// cancels the request's context; the op's own context stays live, so a
// mutation under way learns its outcome rather than being given up on.
func TestInterruptedOpGoesOn(t *testing.T) {
	req, interrupt := context.WithCancel(context.Background())
	ctx, done := interruptible(req)
	interrupt()
	select {
	case <-ctx.Done():
		t.Fatal("an interrupt cancelled the op at once")
	case <-time.After(100 * time.Millisecond):
	}
	done()
	select {
	case <-ctx.Done():
	case <-time.After(time.Second):
		t.Fatal("the op's context outlived the op")
	}
}
