package client

import (
	"google.golang.org/grpc"

	volv1 "github.com/shoal-dev/shoal/proto/shoal/vol/v1"
)

// Vold is a client of shoal-vold's local API: replicated volumes, the
// cluster's key-value store with locks, and named replicated state
// machines.
type Vold struct {
	Volumes  volv1.VolumesClient
	KV       volv1.KVClient
	Machines volv1.StateMachinesClient
	Conn     *grpc.ClientConn
}

// NewVold returns a client of the vold socket in runDir.
func NewVold(runDir string, retry Retry) (*Vold, error) {
	conn, err := Dial(runDir, "vold", retry)
	if err != nil {
		return nil, err
	}
	return &Vold{Volumes: volv1.NewVolumesClient(conn), KV: volv1.NewKVClient(conn), Machines: volv1.NewStateMachinesClient(conn), Conn: conn}, nil
}

// Close closes the connection.
func (c *Vold) Close() error { return c.Conn.Close() }
