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
const prefixSecrets = "/secrets/"

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
	name, data := req.GetName(), req.GetData()
	if err := secret.ValidName(name); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	switch {
	case len(data) == 0:
		return nil, fmt.Errorf("secret %s is empty: %w", name, errdefs.ErrInvalidArgument)
	case len(data) > secret.MaxSize:
		return nil, fmt.Errorf("secret %s is %d bytes; the limit is %d (500 KiB): %w", name, len(data), secret.MaxSize, errdefs.ErrInvalidArgument)
	}
	for k := range req.GetLabels() {
		if k == "" {
			return nil, fmt.Errorf("secret %s: a label has an empty key: %w", name, errdefs.ErrInvalidArgument)
		}
	}
	key, err := c.sealingKey()
	if err != nil {
		return nil, err
	}
	if _, _, err := c.st.Get(prefixSecrets + name); err == nil {
		return nil, fmt.Errorf("secret %s already exists (a secret cannot change: create one under another name and update the services that use it): %w", name, errdefs.ErrAlreadyExists)
	} else if !errdefs.IsNotFound(err) {
		return nil, err
	}
	sealed, err := secret.Seal(key, name, data)
	if err != nil {
		return nil, err
	}
	labels, err := json.Marshal(req.GetLabels())
	if err != nil {
		return nil, err
	}
	now := time.Now()
	if _, err := c.st.Put(ctx, prefixSecrets+name, map[string]crdt.Value{
		"data":       crdt.Bytes(sealed),
		"size":       crdt.Int(int64(len(data))),
		"created":    crdt.Int(now.UnixNano()),
		"created_on": crdt.String(c.nodeID),
		"labels":     crdt.String(string(labels)),
	}); err != nil {
		return nil, err
	}
	c.log.Info("secret created", "secret", name, "size", len(data))
	return &clusterv1.SecretInfo{Name: name, Size: int64(len(data)), Created: timestamppb.New(now), CreatedOn: c.nodeID, Labels: req.GetLabels()}, nil
}

func (s *secretsServer) ListSecrets(ctx context.Context, _ *clusterv1.ListSecretsRequest) (*clusterv1.ListSecretsResponse, error) {
	resp := &clusterv1.ListSecretsResponse{}
	after := ""
	for {
		recs, _, more, err := s.c.st.List(store.ListOptions{Prefix: prefixSecrets, After: after, Limit: 500})
		if err != nil {
			return nil, err
		}
		for _, r := range recs {
			resp.Secrets = append(resp.Secrets, secretInfo(r))
			after = r.Key
		}
		if !more {
			return resp, nil
		}
	}
}

func (s *secretsServer) ReadSecret(ctx context.Context, req *clusterv1.ReadSecretRequest) (*clusterv1.ReadSecretResponse, error) {
	name := req.GetName()
	if err := secret.ValidName(name); err != nil {
		return nil, fmt.Errorf("%v: %w", err, errdefs.ErrInvalidArgument)
	}
	key, err := s.c.sealingKey()
	if err != nil {
		return nil, err
	}
	r, _, err := s.c.st.Get(prefixSecrets + name)
	if errdefs.IsNotFound(err) {
		return nil, fmt.Errorf("secret %s does not exist (`shoalctl secret ls` lists them): %w", name, errdefs.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	sealed := r.Doc.Live()["data"]
	data, err := secret.Open(key, name, sealed.Data)
	if err != nil {
		return nil, fmt.Errorf("secret %s: %v: %w", name, err, errdefs.ErrDataLoss)
	}
	return &clusterv1.ReadSecretResponse{Info: secretInfo(r), Data: data}, nil
}

// secretInfo is what a secret's document says of it, data left out.
func secretInfo(r store.Record) *clusterv1.SecretInfo {
	f := r.Doc.Live()
	info := &clusterv1.SecretInfo{Name: strings.TrimPrefix(r.Key, prefixSecrets)}
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
