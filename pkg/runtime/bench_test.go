package runtime_test

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/shoal-dev/shoal/pkg/runtime"
	"github.com/shoal-dev/shoal/pkg/runtime/runtimetest"
)

// BenchmarkContainerdRun measures Run (create the container and its task
// and start it) of a long-running task against a real containerd, and
// Remove separately. As root:
//
//	go test ./pkg/runtime -run '^$' -bench ContainerdRun -benchtime 30x
func BenchmarkContainerdRun(b *testing.B) {
	d := runtimetest.Start(b)
	rt := d.Runtime(b, nil)
	ctx := context.Background()
	oci, _, _, _ := testImages(b)
	if _, err := rt.Import(ctx, bytes.NewReader(oci)); err != nil {
		b.Fatal(err)
	}
	var run, remove time.Duration
	for i := 0; b.Loop(); i++ {
		id := fmt.Sprintf("bench-%d", i)
		t0 := time.Now()
		if err := rt.Run(ctx, runtime.TaskSpec{ID: id, Image: "local/busybox:latest", Args: sleepArgs}); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := rt.Remove(ctx, id); err != nil {
			b.Fatal(err)
		}
		run += t1.Sub(t0)
		remove += time.Since(t1)
	}
	b.ReportMetric(float64(run.Microseconds())/1000/float64(b.N), "run-ms/op")
	b.ReportMetric(float64(remove.Microseconds())/1000/float64(b.N), "remove-ms/op")
}
