package client

import (
	"google.golang.org/grpc"

	schedv1 "github.com/shoal-dev/shoal/proto/shoal/sched/v1"
)

// Schedd is a client of shoal-schedd's local API.
type Schedd struct {
	schedv1.SchedulerClient
	Conn *grpc.ClientConn
}

// NewSchedd returns a client of the schedd socket in runDir.
func NewSchedd(runDir string, retry Retry) (*Schedd, error) {
	conn, err := Dial(runDir, "schedd", retry)
	if err != nil {
		return nil, err
	}
	return &Schedd{SchedulerClient: schedv1.NewSchedulerClient(conn), Conn: conn}, nil
}

// Close closes the connection.
func (c *Schedd) Close() error { return c.Conn.Close() }
