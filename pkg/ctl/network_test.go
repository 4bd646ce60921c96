package ctl

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	netv1 "github.com/shoal-dev/shoal/proto/shoal/net/v1"
)

func TestNetworkViewJSON(t *testing.T) {
	hs := time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)
	st := &netv1.StatusResponse{
		NodeId: "n1", OverlayCidr: "10.42.0.0/16", Subnet: "10.42.1.0/24", Mode: "userspace", Mtu: 1420,
		Subnets: []*netv1.Subnet{{Subnet: "10.42.2.0/24", Node: "n2"}, {Subnet: "10.42.1.0/24", Node: "n1"}},
		Peers: []*netv1.Peer{
			{Node: "n3", PublicKey: "k3"}, // never shook hands, no bytes
			{Node: "n2", PublicKey: "k2", Endpoint: "192.0.2.2:51820", LastHandshake: timestamppb.New(hs), RxBytes: 10, TxBytes: 20},
		},
		Published: []*netv1.PublishedPort{{Port: 8080, Protocol: "tcp", Service: "web", Backends: []string{"10.42.2.2:80"}}},
	}
	var buf bytes.Buffer
	if err := render(&buf, "json", networkViewOf(st), nil); err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := json.Unmarshal(buf.Bytes(), &got); err != nil {
		t.Fatalf("%v\n%s", err, buf.String())
	}
	peers := got["peers"].([]any)
	first, second := peers[0].(map[string]any), peers[1].(map[string]any)
	// Sorted by node; bytes present even when zero; handshake RFC 3339 or null.
	if first["node"] != "n2" || first["last_handshake"] != "2026-03-04T05:06:07Z" || first["rx_bytes"] != 10.0 || first["tx_bytes"] != 20.0 {
		t.Fatalf("peer n2: %v", first)
	}
	if v, ok := second["last_handshake"]; !ok || v != nil {
		t.Fatalf("peer n3 last_handshake: %v (present %v), want null", v, ok)
	}
	if second["rx_bytes"] != 0.0 || second["tx_bytes"] != 0.0 {
		t.Fatalf("peer n3 bytes: %v", second)
	}
	pub := got["published"].([]any)[0].(map[string]any)
	if pub["port"] != 8080.0 || pub["service"] != "web" || len(pub["backends"].([]any)) != 1 || pub["conflicting"] == nil {
		t.Fatalf("published: %v", pub)
	}
	if s := got["subnets"].([]any)[0].(map[string]any); s["subnet"] != "10.42.1.0/24" {
		t.Fatalf("subnets not sorted: %v", got["subnets"])
	}
	// An empty status still has every list, as [].
	buf.Reset()
	if err := render(&buf, "json", networkViewOf(&netv1.StatusResponse{}), nil); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"peers": []`, `"subnets": []`, `"published": []`} {
		if !strings.Contains(buf.String(), k) {
			t.Fatalf("empty status lacks %s:\n%s", k, buf.String())
		}
	}
}
