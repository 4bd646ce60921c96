package statd

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/shoal-dev/shoal/pkg/crdt"
	"github.com/shoal-dev/shoal/pkg/secret"
	"github.com/shoal-dev/shoal/pkg/store"
	clusterv1 "github.com/shoal-dev/shoal/proto/shoal/cluster/v1"
)

// prefixSecrets holds a document per secret. Its fields:
//
//	data        bytes   the sealed data (secret.Seal)
//	size        int     the data's length in bytes
//	created     int     when it was created (Unix nanoseconds)
//	created_on  string  the node it was created on
//	labels      string  its labels, JSON
//
// A create writes them all at once, with one stamp, so concurrent creates
// of one name on two nodes converge on one of them whole.
//
// Configs are kept alike under prefixConfigs, their data in plain text.
const (
	prefixSecrets = "/secrets/"
	prefixConfigs = "/configs/"
)

// kind is what a call is about: secrets, or configs.
type kind struct {
	noun   string // for messages
	prefix string
	sealed bool
}

func kindOf(config bool) kind {
	if config {
		return kind{noun: "config", prefix: prefixConfigs}
	}
	return kind{noun: "secret", prefix: prefixSecrets, sealed: true}
}

// secretsServer serves shoal.cluster.v1.Secrets on the local socket.
type secretsServer struct {
	clusterv1.UnimplementedSecretsServer
	c *cluster
}

// sealingKey is the key secrets are sealed with, derived from the CA.
func (c *cluster) sealingKey() ([]byte, error) {
	if !c.active.Load() {
		return nil, errNotMember
	}
	ca := c.ca.Load()
	if ca == nil {
		return nil, errNotMember
	}
	return ca.DeriveKey(secret.KeyInfo, secret.KeySize)
}

func (s *secretsServer) CreateSecret(ctx context.Context, req *clusterv1.CreateSecretRequest) (*clusterv1.SecretInfo, error) {
	c := s.c
	k := kindOf(req.GetConfig())
	name, data := req.GetName(), req.GetData()
	if err := secret.ValidName(name); err != nil {
		return nil, fmt.Errorf("%s %v: %w", k.noun, err, errdefs.ErrInvalidArgument)
	}
	switch {
	case len(data) == 0:
		return nil, fmt.Errorf("%s %s is empty: %w", k.noun, name, errdefs.ErrInvalidArgument)
	case len(data) > secret.MaxSize:
		return nil, fmt.Errorf("%s %s is %d bytes; the limit is %d (500 KiB): %w", k.noun, name, len(data), secret.MaxSize, errdefs.ErrInvalidArgument)
	}
	for l := range req.GetLabels() {
		if l == "" {
			return nil, fmt.Errorf("%s %s: a label has an empty key: %w", k.noun, name, errdefs.ErrInvalidArgument)
		}
	}
	key, err := c.sealingKey()
	if err != nil {
		return nil, err
	}
	if _, _, err := c.st.Get(k.prefix + name); err == nil {
		return nil, fmt.Errorf("%s %s already exists (a %s cannot change: create one under another name and update the services that use it): %w", k.noun, name, k.noun, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	stored := data
	if k.sealed {
		if stored, err = secret.Seal(key, name, data); err != nil {
			return nil, err
		}
	}
	labels, err := json.Marshal(req.GetLabels())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if _, err := c.st.Put(ctx, k.prefix+name, map[string]crdt.Value{
		"data":       crdt.Bytes(stored),
		"size":       crdt.Int(int64(len(data))),
		"created":    crdt.Int(now.UnixNano()),
		"created_on": crdt.String(c.nodeID),
		"labels":     crdt.String(string(labels)),
	}); err != nil {
		return nil, err
	}
	c.log.Info(k.noun+" created", k.noun, name, "size", len(data))
	return &clusterv1.SecretInfo{Name: name, Size: int64(len(data)), Created: timestamppb.New(now), CreatedOn: c.nodeID, Labels: req.GetLabels()}, nil
}

func (s *secretsServer) ListSecrets(ctx context.Context, req *clusterv1.ListSecretsRequest) (*clusterv1.ListSecretsResponse, error) {
	k := kindOf(req.GetConfigs())
	resp := &clusterv1.ListSecretsResponse{}
	after := ""
	for {
		recs, _, more, err := s.c.st.List(store.ListOptions{Prefix: k.prefix, After: after, Limit: 500})
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			resp.Secrets = append(resp.Secrets, secretInfo(k, r))
			after = r.Key
		}
		if !more {
			return resp, nil
		}
	}
}

func (s *secretsServer) ReadSecret(ctx context.Context, req *clusterv1.ReadSecretRequest) (*clusterv1.ReadSecretResponse, error) {
	k := kindOf(req.GetConfig())
	name := req.GetName()
	if err := secret.ValidName(name); err != nil {
		return nil, fmt.Errorf("%s %v: %w", k.noun, err, errdefs.ErrInvalidArgument)
	}
	key, err := s.c.sealingKey()
	if err != nil {
		return nil, err
	}
	r, _, err := s.c.st.Get(k.prefix + name)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("%s %s does not exist (`shoalctl %s ls` lists them): %w", k.noun, name, k.noun, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	data := r.Doc.Live()["data"].Data
	if k.sealed {
		if data, err = secret.Open(key, name, data); err != nil {
			return nil, fmt.Errorf("%s %s: %v: %w", k.noun, name, err, errdefs.ErrDataLoss)
		}
	}
	return &clusterv1.ReadSecretResponse{Info: secretInfo(k, r), Data: data}, nil
}

// secretInfo is what a secret's (or config's) document says of it, data
// left out.
func secretInfo(k kind, r store.Record) *clusterv1.SecretInfo {
	f := r.Doc.Live()
	info := &clusterv1.SecretInfo{Name: strings.TrimPrefix(r.Key, k.prefix)}
	info.Size, _ = f["size"].AsInt()
	if ns, ok := f["created"].AsInt(); ok {
		info.Created = timestamppb.New(time.Unix(0, ns))
	}
	info.CreatedOn, _ = f["created_on"].AsString()
	if l, ok := f["labels"].AsString(); ok && l != "" {
		json.Unmarshal([]byte(l), &info.Labels) // a hand-edited field is left out
	}
	return info
}
