package bench

import (
	"context"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
)

// auditTransfers gives the audit sale transfers [from, to): through the coordinator while
// their number stays within cfg.TransfersViaCoordinator, the rest stored (storeTransfers).
func (g *scaleRig) auditTransfers(ctx context.Context, cfg *ScaleConfig, from, to int) error {
	via := max(cfg.TransfersViaCoordinator, len(scaleRegions)+3) // the allocation's, and one each way to copy
	if err := g.transfers(ctx, from, min(to, via), cfg.TransfersInFlight); err != nil {
		return err
	}
	if to <= via {
		return nil
	}
	return g.storeTransfers(ctx, max(from, via), to)
}

// storeTransfers writes posted transfers [from, to) of one unit each straight into the
// ledger's and the regions' tables, each a copy of the coordinator-made transfer that went the
// same way round the regions (request t-<n mod 3 + 3>, as transfers names them; the ledger
// stores it as transfer/t-…) with its own id, and moves the pools' counts to match in the same statement as the records (the source's
// available and debited_out, the destination's available and credited_in), so the books
// balance as if the coordinator had made them. The regions' leaders keep their pools in
// memory: the bench makes no reservation after this, and the audit reads the databases.
func (g *scaleRig) storeTransfers(ctx context.Context, from, to int) error {
	ledger := g.dev.Coordinator.DB
	for way := range len(scaleRegions) {
		n := way + len(scaleRegions) // t-3, t-4, t-5: after the allocation's three
		var id, src, dst string
		var units int64
		if err := ledger.QueryRow(ctx, `SELECT transfer_id, from_pool, to_pool, units FROM transfers WHERE request_id = $1`,
			"transfer/t-"+strconv.Itoa(n)).Scan(&id, &src, &dst, &units); err != nil {
			return fmt.Errorf("the transfer to copy (t-%d): %w", n, err)
		}
		series := `generate_series($2::bigint, $3::bigint - 1) s WHERE s % 3 = $4`
		args := []any{id, int64(from), int64(to), int64(way)}
		if _, err := ledger.Exec(ctx, `INSERT INTO transfers SELECT (jsonb_populate_record(t,
				jsonb_build_object('transfer_id', 'bulk-' || s, 'request_id', 'transfer/bulk-' || s))).*
			FROM transfers t, `+series+` AND t.transfer_id = $1`, args...); err != nil {
			return fmt.Errorf("store transfers in the ledger: %w", err)
		}
		if err := copyRegionRecords(ctx, g.regionDB(src), "transfers_out", `available = available - n.c * $5, debited_out = debited_out + n.c * $5`, series, append(args, units)); err != nil {
			return fmt.Errorf("region %s: %w", src, err)
		}
		if err := copyRegionRecords(ctx, g.regionDB(dst), "transfers_in", `available = available + n.c * $5, credited_in = credited_in + n.c * $5`, series, append(args, units)); err != nil {
			return fmt.Errorf("region %s: %w", dst, err)
		}
	}
	return nil
}

// copyRegionRecords copies a region's record of transfer $1 (table: transfers_in or
// transfers_out) once per number of series, with the transfer ids the ledger's copies have,
// and applies set to the audit sale's pool, n.c being the records copied.
func copyRegionRecords(ctx context.Context, db *pgxpool.Pool, table, set, series string, args []any) error {
	res, err := db.Exec(ctx, `WITH ins AS (INSERT INTO `+table+` SELECT (jsonb_populate_record(r,
				jsonb_build_object('transfer_id', 'bulk-' || s))).*
			FROM `+table+` r, `+series+` AND r.transfer_id = $1 RETURNING sale_id, sku),
		n AS (SELECT count(*) AS c FROM ins)
		UPDATE pools SET `+set+` FROM n WHERE sale_id = '`+auditSale+`' AND sku = 'sku'`, args...)
	if err != nil {
		return fmt.Errorf("store %s: %w", table, err)
	}
	if res.RowsAffected() != 1 {
		return fmt.Errorf("store %s: no pool %s/sku", table, auditSale)
	}
	return nil
}

// regionDB is the database of the rig's region name.
func (g *scaleRig) regionDB(name string) *pgxpool.Pool {
	for _, r := range g.dev.Regions {
		if r.R.Name() == name {
			return r.DB
		}
	}
	panic("bench: no region " + name) // the rig's regions are scaleRegions: a programmer error
}
