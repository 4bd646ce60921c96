// Package taskinit is shoal-init, the init process a task started with
// --init runs as its PID 1 (as docker's --init runs tini): it starts the
// task's command as its child, passes it every signal it can catch, reaps
// every process that ends under it (orphans re-parented to PID 1 would
// stay zombies under a command that never waits for them), and exits as
// the child did.
package taskinit

import (
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Run starts args as the child and returns the exit code to end with:
// the child's, or 128+N when signal N ended it. errOut receives why the
// child could not start (exit 127 when it does not exist, 126 else).
func Run(args []string, errOut io.Writer) int {
	if len(args) == 0 {
		fmt.Fprintln(errOut, "shoal-init: no command given")
		return 2
	}
	// Not PID 1 (a test, or nested): orphans come here all the same.
	_ = unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs) // every signal the runtime lets a program catch
	path, err := lookPath(args[0])
	if err != nil {
		fmt.Fprintf(errOut, "shoal-init: %v\n", err)
		return 127
	}
	child, err := os.StartProcess(path, args, &os.ProcAttr{Files: []*os.File{os.Stdin, os.Stdout, os.Stderr}})
	if err != nil {
		fmt.Fprintf(errOut, "shoal-init: %v\n", err)
		return 126
	}
	// A full channel drops signals, SIGCHLD among them: every wake-up
	// reaps, and a slow tick does too.
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		select {
		case sig := <-sigs:
			// Go's runtime uses SIGURG for itself: not the task's.
			if sig != syscall.SIGCHLD && sig != syscall.SIGURG {
				_ = child.Signal(sig)
			}
		case <-tick.C:
		}
		if code, done := reap(child.Pid); done {
			return code
		}
	}
}

// reap waits for every process that has ended under this one; done is
// set, with the exit code to end with, once pid is among them.
func reap(pid int) (code int, done bool) {
	for {
		var ws unix.WaitStatus
		got, err := unix.Wait4(-1, &ws, unix.WNOHANG, nil)
		if err != nil || got <= 0 {
			return code, done
		}
		if got != pid {
			continue
		}
		done = true
		switch {
		case ws.Exited():
			code = ws.ExitStatus()
		case ws.Signaled():
			code = 128 + int(ws.Signal())
		}
	}
}

// lookPath finds the command as a shell would: a name with a '/' as it
// is, else in $PATH (the task's image sets it).
func lookPath(name string) (string, error) {
	path, err := exec.LookPath(name)
	if err != nil && !errors.Is(err, exec.ErrDot) {
		return "", fmt.Errorf("%s: command not found", name)
	}
	return path, nil
}
