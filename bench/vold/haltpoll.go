package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// haltPollParam is the cpuidle haltpoll driver's guest halt polling: how
// long an idle vCPU of a KVM guest polls for work before it halts into
// the host. The kernel's default is 200 µs; a guest booted with
// haltpoll.guest_halt_poll_ns=0 halts at once, and waking a halted vCPU
// costs tens of microseconds more. A volume's synchronous write waits
// idle several times (the follower for the append and for its sync's
// completion, the leader for the acknowledgement), a local one once, so
// that setting weighs on the volume's rows far more than on the
// baseline's; the second pass of the 4 KiB rows measures both with the
// kernel's default.
const haltPollParam = "/sys/module/haltpoll/parameters/guest_halt_poll_ns"

// haltPoll reads the guest halt polling setting; ok is false when the
// machine has none (no haltpoll driver: not a KVM guest, or another
// cpuidle driver) or it cannot be written.
func haltPoll() (ns int, ok bool) {
	raw, err := os.ReadFile(haltPollParam)
	if err != nil {
		return 0, false
	}
	ns, err = strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0, false
	}
	f, err := os.OpenFile(haltPollParam, os.O_WRONLY, 0)
	if err != nil {
		return 0, false
	}
	f.Close()
	return ns, true
}

func setHaltPoll(ns int) error {
	if err := os.WriteFile(haltPollParam, []byte(strconv.Itoa(ns)), 0); err != nil {
		return fmt.Errorf("set guest halt polling to %d ns: %w", ns, err)
	}
	return nil
}

// randomPolled runs the single-writer 4 KiB rows again with guest halt
// polling at c.haltPollNs, when the machine runs with another value, and
// puts the setting back (also on failure or interrupt). It returns nil
// when there is nothing to measure.
func (b *bench) randomPolled(ctx context.Context) *polledRand {
	want := b.c.haltPollNs
	if want <= 0 {
		return nil
	}
	was, ok := haltPoll()
	if !ok {
		progress("no writable %s: the second pass of the 4 KiB writes is left out", haltPollParam)
		return nil
	}
	if was == want {
		return nil // the first pass measured it
	}
	restore := func() {
		if err := setHaltPoll(was); err != nil {
			progress("%v", err)
		}
	}
	atCleanup(restore)
	if err := setHaltPoll(want); err != nil {
		fail("%v", err)
	}
	progress("random 4 KiB O_DSYNC writes with guest halt polling at %d ns (was %d): %d × %v", want, was, b.c.reps, b.c.randDur)
	r := b.random(ctx, false)
	restore()
	return &polledRand{rnd: r, was: was, ns: want}
}

// polledRand is the second pass of the 4 KiB rows.
type polledRand struct {
	rnd     randResult
	was, ns int
}
