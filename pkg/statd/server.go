package statd

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"github.com/containerd/errdefs"

	"github.com/shoal-dev/shoal/pkg/statepb"
	"github.com/shoal-dev/shoal/pkg/store"
	statev1 "github.com/shoal-dev/shoal/proto/shoal/state/v1"
)

// stateServer serves shoal.state.v1 over the store. Handlers return plain
// wrapped errors; the runtime's interceptor maps them to gRPC codes.
type stateServer struct {
	statev1.UnimplementedStateServer
	st *store.Store
}

const (
	defaultPageSize = 100
	maxPageSize     = 1000
)

func (s *stateServer) Get(_ context.Context, req *statev1.GetRequest) (*statev1.GetResponse, error) {
	rec, rev, err := s.st.Get(req.GetKey())
	if err != nil {
		return nil, err
	}
	return &statev1.GetResponse{Document: statepb.ToDocument(rec.Key, rec.Rev, rec.Doc, req.GetWithMeta()), Revision: rev}, nil
}

func (s *stateServer) Put(ctx context.Context, req *statev1.PutRequest) (*statev1.PutResponse, error) {
	fields, err := statepb.FromFields(req.GetFields())
	if err != nil {
		return nil, err
	}
	res, err := s.st.Put(ctx, req.GetKey(), fields)
	if err != nil {
		return nil, err
	}
	return &statev1.PutResponse{Revision: res.Rev, Document: statepb.ToDocument(res.Record.Key, res.Record.Rev, res.Record.Doc, false)}, nil
}

func (s *stateServer) Delete(ctx context.Context, req *statev1.DeleteRequest) (*statev1.DeleteResponse, error) {
	res, err := s.st.Delete(ctx, req.GetKey(), req.GetFields())
	if err != nil {
		return nil, err
	}
	return &statev1.DeleteResponse{Revision: res.Rev, Existed: res.Existed}, nil
}

func (s *stateServer) List(_ context.Context, req *statev1.ListRequest) (*statev1.ListResponse, error) {
	size := int(req.GetPageSize())
	switch {
	case size < 0:
		return nil, fmt.Errorf("page_size must not be negative: %w", errdefs.ErrInvalidArgument)
	case size == 0:
		size = defaultPageSize
	case size > maxPageSize:
		size = maxPageSize
	}
	after := ""
	if tok := req.GetPageToken(); tok != "" {
		b, err := base64.RawURLEncoding.DecodeString(tok)
		if err != nil || !strings.HasPrefix(string(b), req.GetPrefix()) {
			return nil, fmt.Errorf("invalid page_token: %w", errdefs.ErrInvalidArgument)
		}
		after = string(b)
	}
	recs, rev, more, err := s.st.List(store.ListOptions{Prefix: req.GetPrefix(), After: after, Limit: size})
	if err != nil {
		return nil, err
	}
	resp := &statev1.ListResponse{Revision: rev, Documents: make([]*statev1.Document, 0, len(recs))}
	for _, r := range recs {
		resp.Documents = append(resp.Documents, statepb.ToDocument(r.Key, r.Rev, r.Doc, req.GetWithMeta()))
	}
	if more && len(recs) > 0 {
		resp.NextPageToken = base64.RawURLEncoding.EncodeToString([]byte(recs[len(recs)-1].Key))
	}
	return resp, nil
}

func (s *stateServer) Watch(req *statev1.WatchRequest, stream statev1.State_WatchServer) error {
	after := s.st.Revision()
	if req.AfterRevision != nil {
		after = req.GetAfterRevision()
	}
	err := s.st.Watch(stream.Context(), req.GetPrefix(), after, func(b store.WatchBatch) error {
		resp := &statev1.WatchResponse{Revision: b.Rev, Events: make([]*statev1.Event, 0, len(b.Events))}
		for _, e := range b.Events {
			typ := statev1.Event_TYPE_PUT
			if !e.Doc.Exists() {
				typ = statev1.Event_TYPE_DELETE
			}
			resp.Events = append(resp.Events, &statev1.Event{
				Type:     typ,
				Revision: e.Rev,
				Document: statepb.ToDocument(e.Key, e.Rev, e.Doc, req.GetWithMeta()),
			})
		}
		return stream.Send(resp)
	})
	if errors.Is(err, store.ErrClosed) {
		return fmt.Errorf("statd is shutting down: %w", errdefs.ErrUnavailable)
	}
	return err
}

func (s *stateServer) Status(context.Context, *statev1.StatusRequest) (*statev1.StatusResponse, error) {
	st := s.st.Status()
	return &statev1.StatusResponse{
		NodeId:         st.NodeID,
		Keys:           st.Live,
		Tombstones:     st.Tombstones,
		RootHash:       st.Root.String(),
		Revision:       st.Revision,
		OldestRevision: st.Oldest,
		Counters:       st.Counters,
	}, nil
}
