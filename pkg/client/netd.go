package client

import (
	"google.golang.org/grpc"

	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

// Netd is a client of shoal-netd's local API.
type Netd struct {
	netv1.NetworkClient
	Conn *grpc.ClientConn
}

// NewNetd returns a client of the netd socket in runDir.
func NewNetd(runDir string, retry Retry) (*Netd, error) {
	conn, err := Dial(runDir, "netd", retry)
	if err != nil {
		return nil, err
	}
	return &Netd{NetworkClient: netv1.NewNetworkClient(conn), Conn: conn}, nil
}

// Close closes the connection.
func (c *Netd) Close() error { return c.Conn.Close() }
