package volfs

import (
	"context"
	"strconv"
)

// A request key names one request of a client across retries by
// processes other than the one that first made it: a FUSE request that a
// restarted vold gets again from the kernel carries the key the first
// vold proposed it with, so the group applies it once (the Raft host
// remembers recent keys and their results).

type keyCtx struct{}

// WithRequestKey returns ctx carrying key for the mutations made with it.
func WithRequestKey(ctx context.Context, key string) context.Context {
	return context.WithValue(ctx, keyCtx{}, key)
}

// RequestKey returns the key ctx carries ("" if none).
func RequestKey(ctx context.Context) string {
	k, _ := ctx.Value(keyCtx{}).(string)
	return k
}

// chunkKey gives the i-th mutation of a request made of several its own
// key.
func chunkKey(ctx context.Context, i int) context.Context {
	if i == 0 {
		return ctx
	}
	if k := RequestKey(ctx); k != "" {
		return WithRequestKey(ctx, k+"#"+strconv.Itoa(i))
	}
	return ctx
}
