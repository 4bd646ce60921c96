package wg

import (
	"fmt"
	"time"

	"golang.zx2c4.com/wireguard/wgctrl"
	"golang.zx2c4.com/wireguard/wgctrl/wgtypes"

	"github.com/shoal-dev/shoal/pkg/overlay"
)

// Device configures one WireGuard interface through wgctrl: a userspace
// device by its UAPI socket (from any network namespace), or a kernel one
// in the caller's namespace. Closing a Device only closes the control
// connection; the interface and its sessions stay up. A Device is safe for
// concurrent use, but ApplyPeers calls should not race each other (each
// diffs against what it read).
type Device struct {
	name string
	c    *wgctrl.Client
}

// PeerStatus is a peer as the device reports it.
type PeerStatus struct {
	overlay.Peer
	// LastHandshake is the time of the last completed handshake (zero if
	// none). WireGuard re-handshakes every 2 minutes while traffic flows.
	LastHandshake time.Time
	// RxBytes and TxBytes count encrypted traffic with the peer since the
	// peer was added.
	RxBytes, TxBytes int64
}

// Open opens the existing WireGuard interface iface.
func Open(iface string) (*Device, error) {
	c, err := wgctrl.New()
	if err != nil {
		return nil, fmt.Errorf("wg: wgctrl: %w", err)
	}
	if _, err := c.Device(iface); err != nil {
		c.Close()
		return nil, fmt.Errorf("wg: open %s: %w", iface, err)
	}
	return &Device{name: iface, c: c}, nil
}

// Name is the interface name.
func (d *Device) Name() string { return d.name }

// Close closes the control connection (not the interface).
func (d *Device) Close() error { return d.c.Close() }

// State returns everything the device reports.
func (d *Device) State() (*wgtypes.Device, error) {
	dev, err := d.c.Device(d.name)
	if err != nil {
		return nil, fmt.Errorf("wg: read %s: %w", d.name, err)
	}
	return dev, nil
}

// PublicKey returns the device's public key (zero if it has no private
// key yet).
func (d *Device) PublicKey() (wgtypes.Key, error) {
	s, err := d.State()
	if err != nil {
		return wgtypes.Key{}, err
	}
	return s.PublicKey, nil
}

// ListenPort returns the device's UDP port.
func (d *Device) ListenPort() (int, error) {
	s, err := d.State()
	if err != nil {
		return 0, err
	}
	return s.ListenPort, nil
}

// SetPrivateKey sets the device's private key unless it already has it.
// A different key drops every session (peers must learn the new public
// key), so persist it: LoadOrCreateKey.
func (d *Device) SetPrivateKey(k wgtypes.Key) error {
	s, err := d.State()
	if err != nil {
		return err
	}
	if s.PrivateKey == k {
		return nil
	}
	if err := d.c.ConfigureDevice(d.name, wgtypes.Config{PrivateKey: &k}); err != nil {
		return fmt.Errorf("wg: set private key of %s: %w", d.name, err)
	}
	return nil
}

// SetListenPort sets the device's UDP port unless it already has it
// (setting it rebinds the socket, even to the same port).
func (d *Device) SetListenPort(port int) error {
	s, err := d.State()
	if err != nil {
		return err
	}
	if s.ListenPort == port {
		return nil
	}
	if err := d.c.ConfigureDevice(d.name, wgtypes.Config{ListenPort: &port}); err != nil {
		return fmt.Errorf("wg: set listen port of %s to %d: %w", d.name, port, err)
	}
	return nil
}

// ApplyPeers makes the device's peers the desired ones by diff
// (overlay.DiffPeers): unchanged peers are not touched, so their sessions
// and counters carry on. A desired peer with the device's own public key
// is skipped. It returns the changes it applied (none if the device was
// already as desired) and fails without applying anything if desired is
// invalid (overlay.ValidatePeers).
func (d *Device) ApplyPeers(desired []overlay.Peer) ([]wgtypes.PeerConfig, error) {
	s, err := d.State()
	if err != nil {
		return nil, err
	}
	own := make([]overlay.Peer, 0, len(desired))
	for _, p := range desired {
		if p.PublicKey != s.PublicKey || s.PublicKey == (wgtypes.Key{}) {
			own = append(own, p)
		}
	}
	if err := overlay.ValidatePeers(own); err != nil {
		return nil, err
	}
	cfgs := overlay.DiffPeers(s.Peers, own)
	if len(cfgs) == 0 {
		return nil, nil
	}
	if err := d.c.ConfigureDevice(d.name, wgtypes.Config{Peers: cfgs}); err != nil {
		return nil, fmt.Errorf("wg: configure peers of %s: %w", d.name, err)
	}
	return cfgs, nil
}

// Peers returns the device's peers with their handshake time and byte
// counters, in the device's order.
func (d *Device) Peers() ([]PeerStatus, error) {
	s, err := d.State()
	if err != nil {
		return nil, err
	}
	out := make([]PeerStatus, 0, len(s.Peers))
	for _, p := range s.Peers {
		out = append(out, PeerStatus{
			Peer:          overlay.PeerFromWG(p),
			LastHandshake: p.LastHandshakeTime,
			RxBytes:       p.ReceiveBytes,
			TxBytes:       p.TransmitBytes,
		})
	}
	return out, nil
}
