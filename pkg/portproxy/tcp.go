package portproxy

import (
	"errors"
	"io"
	"net"
	"time"
)

type tcpListener struct {
	pt *entry
	ln *net.TCPListener
}

func (t *tcpListener) close() { t.ln.Close() }

func (t *tcpListener) serve() {
	p := t.pt.p
	defer p.wg.Done()
	var backoff time.Duration
	for {
		c, err := t.ln.AcceptTCP()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// Out of file descriptors and the like: back off instead of
			// spinning, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("accept", "addr", t.ln.Addr(), "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		if !p.track(c) {
			return
		}
		p.wg.Add(1)
		go t.pt.handleTCP(c)
	}
}

// handleTCP connects client to a backend and copies between them.
func (pt *entry) handleTCP(client *net.TCPConn) {
	p := pt.p
	defer p.wg.Done()
	pt.active.Add(1)
	defer pt.active.Add(-1)

	var backend *net.TCPConn
	for _, b := range pt.order() {
		d := net.Dialer{Timeout: p.cfg.DialTimeout}
		c, err := d.DialContext(p.ctx, "tcp", b.String())
		if err == nil {
			pt.markOK(b)
			backend = c.(*net.TCPConn)
			break
		}
		if p.ctx.Err() != nil {
			break
		}
		pt.markFailed(b)
		p.log.Debug("backend did not accept", "port", pt.port, "backend", b, "err", err)
	}
	if backend == nil {
		// Reset rather than a clean close, so the client does not take
		// an empty answer for a real one.
		client.SetLinger(0)
		client.Close()
		p.untrack(client)
		if p.ctx.Err() == nil {
			p.log.Warn("no backend for connection", "port", pt.port, "client", client.RemoteAddr())
		}
		return
	}
	if !p.track(backend) {
		client.Close()
		p.untrack(client)
		return
	}
	pipe(client, backend)
	p.untrack(client, backend)
}

// pipe copies a→b and b→a. When one direction ends cleanly (EOF), the
// write side of the other connection is shut down and the other direction
// goes on (half-close); when it ends with an error, both connections are
// closed. pipe returns when both directions are done, with both closed.
func pipe(a, b *net.TCPConn) {
	oneWay := func(dst, src *net.TCPConn) {
		// *net.TCPConn to *net.TCPConn: splice(2) on Linux.
		_, err := io.Copy(dst, src)
		if err == nil {
			err = dst.CloseWrite()
		}
		if err != nil {
			a.Close()
			b.Close()
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		oneWay(b, a)
	}()
	oneWay(a, b)
	<-done
	a.Close()
	b.Close()
}
