package coordhttp

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/quotaworks/quota/coordinator"
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/rpcserve"
	"github.com/quotaworks/quota/transfer"
)

// actionTimeout bounds one action: a resolve or a rebalance calls regions.
const actionTimeout = 30 * time.Second

// resolve settles a transfer by its participants' records (Coordinator.Resolve): credit it,
// or with refuse, refuse it at the destination and restore the source.
func (h *handler) resolve(w http.ResponseWriter, r *http.Request, s session) error {
	var req struct {
		Refuse bool `json:"refuse"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	id := r.PathValue("id")
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	t, err := h.b.Resolve(ctx, id, req.Refuse)
	h.opts.Logger.Info("console resolve", "role", s.role, "name", s.name, "transfer", id, "refuse", req.Refuse,
		"state", t.State, "stranded", t.Stranded, "err", err)
	h.record(r.Context(), s, "resolve transfer", id, fmt.Sprintf(`{"transferId":%q,"refuse":%t}`, id, req.Refuse), err)
	if err != nil {
		return fmt.Errorf("resolve %s: %w", id, err)
	}
	h.views.forget(t.Sale)
	rpcserve.WriteJSON(w, http.StatusOK, toTransferJSON(t, h.opts.Now()))
	return nil
}

// rebalanceJSON is the answer of an apply: the moves made and their transfers.
type rebalanceJSON struct {
	Moves     []moveJSON     `json:"moves"`
	Transfers []transferJSON `json:"transfers"`
	Replayed  bool           `json:"replayed"`
}

// rebalance runs the automatic rebalancer's plan of one SKU now (Coordinator.Rebalance with
// Auto), whatever holds it back (the sale's mode, the cooldown): an operator's decision. The
// page sends a request id of its own per click, so a retry moves nothing more.
func (h *handler) rebalance(w http.ResponseWriter, r *http.Request, s session) error {
	var req struct {
		SKU       string `json:"sku"`
		RequestID string `json:"request_id"`
	}
	if err := decode(r, &req); err != nil {
		return err
	}
	if !validWord(req.RequestID, 64) {
		return apierr.Invalid("request_id", "want 1 to 64 characters of A-Z a-z 0-9 _ -")
	}
	sale := r.PathValue("sale")
	ctx, cancel := context.WithTimeout(r.Context(), actionTimeout)
	defer cancel()
	res, err := h.b.Rebalance(ctx, coordinator.RebalanceRequest{Sale: sale, SKU: req.SKU, Auto: true,
		RequestID: "console-" + req.RequestID})
	h.opts.Logger.Info("console rebalance", "role", s.role, "name", s.name, "sale", sale, "sku", req.SKU,
		"moves", len(res.Moves), "replayed", res.Replayed, "err", err)
	h.record(r.Context(), s, "rebalance", sale+"/"+req.SKU, fmt.Sprintf(`{"saleId":%q,"sku":%q,"requestId":%q,"auto":true}`,
		sale, req.SKU, "console-"+req.RequestID), err)
	h.views.forget(sale)
	if err != nil {
		return fmt.Errorf("rebalance %s %s: %w", sale, req.SKU, err)
	}
	out := rebalanceJSON{Moves: []moveJSON{}, Transfers: []transferJSON{}, Replayed: res.Replayed}
	for _, m := range res.Moves {
		out.Moves = append(out.Moves, moveJSON{m.From, m.To, int64(m.Units)})
	}
	now := h.opts.Now()
	for _, t := range res.Transfers {
		out.Transfers = append(out.Transfers, toTransferJSON(t, now))
	}
	rpcserve.WriteJSON(w, http.StatusOK, out)
	return nil
}

// record writes one console action to the coordinator's action log (Backend.RecordAction),
// with the session's role and login name, after the action and whatever its result; a log
// that cannot be written is logged at error level.
func (h *handler) record(ctx context.Context, s session, action, target, detail string, err error) {
	result := "ok"
	if err != nil {
		result = "error: " + err.Error()
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	a, rerr := h.b.RecordAction(rctx, transfer.Action{Role: string(s.role), Actor: s.name, Via: "console", Action: action,
		Target: target, Detail: detail, Result: result})
	if rerr != nil {
		h.opts.Logger.Error("the action log could not record a console action", "action", action, "target", target, "name", s.name, "err", rerr)
		return
	}
	h.opts.Logger.Info("action recorded", "seq", a.Seq, "action", action, "target", target, "name", s.name, "role", s.role)
}
