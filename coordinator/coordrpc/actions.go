package coordrpc

import (
	"context"
	"encoding/hex"
	"log/slog"
	"time"

	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/transfer"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// recordTimeout bounds the write of one action to the log.
const recordTimeout = 5 * time.Second

// record writes one state-changing call to the coordinator's action log (Coordinator.
// RecordAction): the caller's certificate role and name, the method, its target, the request
// as JSON, and the result. It runs after the call, whatever its result, even if the caller
// has gone; a log that cannot be written is logged at error level (the call's answer stands:
// what it did is done).
func (s *Server) record(ctx context.Context, action, target string, req proto.Message, err error) {
	c := trust.CallerOf(ctx)
	actor := c.Name
	if !c.Certified {
		actor = "(no client certificate)"
	}
	detail, jerr := protojson.Marshal(req)
	if jerr != nil {
		detail = []byte("(request not encodable: " + jerr.Error() + ")")
	}
	result := "ok"
	if err != nil {
		result = "error: " + err.Error()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	a, rerr := s.C.RecordAction(rctx, transfer.Action{Role: string(c.Role), Actor: actor, Via: "grpc", Action: action,
		Target: target, Detail: string(detail), Result: result})
	log := s.Logger
	if log == nil {
		log = slog.Default()
	}
	if rerr != nil {
		log.Error("the action log could not record a call", "action", action, "target", target, "actor", actor, "result", result, "err", rerr)
		return
	}
	log.Info("action recorded", "seq", a.Seq, "action", action, "target", target, "actor", actor, "role", c.Role, "hash", hex.EncodeToString(a.Hash))
}

// ListActions implements CoordinatorService.
func (s *Server) ListActions(ctx context.Context, req *quotav1.ListActionsRequest) (*quotav1.ListActionsResponse, error) {
	limit := int(req.GetLimit())
	if limit == 0 {
		limit = 1000
	}
	as, err := s.C.Records().ListActions(ctx, req.GetAfterSeq(), limit)
	if err != nil {
		return nil, err
	}
	out := &quotav1.ListActionsResponse{}
	for _, a := range as {
		out.Actions = append(out.Actions, &quotav1.ActionRecord{Seq: a.Seq, At: timestamppb.New(a.At), Role: a.Role, Actor: a.Actor,
			Via: a.Via, Action: a.Action, Target: a.Target, Detail: a.Detail, Result: a.Result, PrevHash: a.PrevHash, Hash: a.Hash})
	}
	return out, nil
}
