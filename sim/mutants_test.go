package sim

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"
)

var (
	flagPlanted      = flag.Bool("planted", false, "plant each known bug in a scratch copy of the tree and require the simulation to fail (make mutants)")
	flagPlantedSeeds = flag.Int("planted-seeds", 1000, "seeds the simulation may take to catch each planted bug")
	flagPlantedOnly  = flag.String("planted-only", "", "plant only the bug of this name")
	flagPlantedAll   = flag.Bool("planted-all", false, "run every seed, not stopping at the first failure, and count the failing ones")
	flagPlantedShape = flag.String("planted-shape", ShapeDefault, "the shape the simulation runs each planted bug at (default or national)")
)

// plantedBug is a small textual change to one file of the tree: old must occur in it
// exactly once (so a change of the code the bug is planted in is noticed, not skipped).
type plantedBug struct {
	name, file, old, new, what string
}

// plantedBugs are the bugs the simulation must catch within -planted-seeds seeds; the
// planted-bug table of docs/reliability.md records the seed that catches each.
var plantedBugs = []plantedBug{
	{
		name: "lost-credit-reply-restores", file: "coordinator/drive.go",
		what: "the driver treats a Credit that got no answer as a refusal and restores the source",
		old: `		d.strand(ctx, fmt.Errorf("credit at %s: %w", d.t.To, r.Err).Error())
		return Call{}, false
	}
	return d.afterCredit(ctx, r.In)`,
		new: `		return d.abort(ctx)
	}
	return d.afterCredit(ctx, r.In)`,
	},
	{
		name: "ledger-write-unfenced", file: "coordinator/drive.go",
		what: "the driver's ledger transactions skip the generation fence",
		old: `		if err := tx.CheckFence(d.gen); err != nil {
			return err
		}
		return fn(tx)`,
		new: `		return fn(tx)`,
	},
	{
		name: "credit-applied-twice", file: "region/transfer_effects.go",
		what: "a destination's credit adds the units again when the transfer is credited already (in SQL and in the simulation alike)",
		old: `	if err != nil || !add {
		return st, transferEffects{}, err
	}
	want.State = st`,
		new: `	if err == nil && !add && st == transfer.InCredited {
		return st, transferEffects{poolRow: true, pool: countsDelta{available: req.Units, creditedIn: req.Units}}, nil
	}
	if err != nil || !add {
		return st, transferEffects{}, err
	}
	want.State = st`,
	},
	{
		name: "restore-without-refusal", file: "coordinator/drive.go",
		what: "resolve --refuse restores the source whatever the destination answers (also when it credited)",
		old:  `	if r.In == transfer.InRefused {`,
		new:  `	if r.In != "" {`,
	},
	{
		name: "settle-restores", file: "region/transfer_effects.go",
		what: "a source's Settle returns the units to its pool as a Restore does: units back at the source without the destination's refusal",
		old:  `	if to == transfer.OutVoided {`,
		new:  `	if to == transfer.OutVoided || to == transfer.OutSettled {`,
	},
	{
		name: "epoch-fence-admits-deposed", file: "transfer/participant.go",
		what: "the region writer's epoch fence (transfer.CurrentEpoch, applied by fencing.CheckEpoch and by the simulation's store) refuses only an epoch above the recorded one, so a deposed leader's batches commit",
		old:  `	if epoch != recorded {`,
		new:  `	if epoch > recorded {`,
	},
	{
		name: "cart-first-line-alone", file: "region/cart.go",
		what: "a cart whose second line is refused still holds its first line (the refusal is answered, line 0 taken)",
		old: `	if err := o.refusals(b); err != nil {
		return cartAnswer{}, err, nil
	}`,
		new: `	if err := o.refusals(b); err != nil {
		if ce := err.(*CartError); ce.Lines[0].Line > 0 {
			l := o.cart.Lines[0]
			b.take(&memHold{Hold: Hold{ID: o.ids[0], Region: o.region, Sale: req.Sale, SKU: l.SKU, User: req.User, Quantity: l.Quantity,
				RequestKey: req.RequestKey, State: Held, CreatedAt: b.now, ExpiresAt: b.now.Add(o.terms.HoldTTL), CartID: o.ids[0]}, hash: o.hash})
		}
		return cartAnswer{}, err, nil
	}`,
	},
}

// TestPlantedBugs (with -planted; `make mutants`) plants each bug of plantedBugs alone in a
// scratch copy of the module, runs the simulation there over -planted-seeds seeds (stopping
// at the first failing seed), and fails unless the simulation fails. It logs the seed that
// caught each bug and what broke.
func TestPlantedBugs(t *testing.T) {
	if !*flagPlanted {
		t.Skip("planted bugs run with -planted (make mutants)")
	}
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	for _, b := range plantedBugs {
		if *flagPlantedOnly != "" && b.name != *flagPlantedOnly {
			continue
		}
		t.Run(b.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := copyModule(root, dir); err != nil {
				t.Fatalf("copy the module: %v", err)
			}
			if err := plant(dir, b); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			out, runErr := simIn(dir, *flagPlantedShape, *flagPlantedSeeds, !*flagPlantedAll)
			seed, detail := firstFailure(out)
			if runErr == nil || seed == 0 {
				t.Fatalf("%s (%s): the simulation did not catch it in %d seeds (err %v):\n%s", b.name, b.what, *flagPlantedSeeds, runErr, out)
			}
			t.Logf("PLANTED %s: caught by seed %d%s (%s wall): %s", b.name, seed, failedOf(out), time.Since(start).Round(time.Second), detail)
		})
	}
}

// plant applies bug b to its file in dir.
func plant(dir string, b plantedBug) error {
	path := filepath.Join(dir, b.file)
	src, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("plant %s: %w", b.name, err)
	}
	if n := strings.Count(string(src), b.old); n != 1 {
		return fmt.Errorf("plant %s: the text to change occurs %d times in %s, want once: the code moved, update the bug", b.name, n, b.file)
	}
	return os.WriteFile(path, []byte(strings.Replace(string(src), b.old, b.new, 1)), 0o644)
}

// simIn runs the simulation at shape in module dir over seeds 1..seeds (with stop, none
// after the first failure), bounded by 10 minutes.
func simIn(dir, shape string, seeds int, stop bool) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "go", "test", "-count=1", "-run", "TestSimulation$", "./sim/",
		"-args", "-shape", shape, "-seeds", strconv.Itoa(seeds), "-stop="+strconv.FormatBool(stop))
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	return string(out), err
}

var simLine = regexp.MustCompile(`SIM: (\d+) seeds \(\d+\.\.\d+\), (\d+) failed`)

// failedOf is ", failing N of M seeds run" from a simulation's figures ("" without them).
func failedOf(out string) string {
	m := simLine.FindStringSubmatch(out)
	if m == nil {
		return ""
	}
	return fmt.Sprintf(", failing %s of %s seeds run", m[2], m[1])
}

var failedSeed = regexp.MustCompile(`(?m)seed (\d+), step (\d+) \(simulated [^)]*\): (.*(?:\n +[^ \n].*)?)$`)

// firstFailure is the smallest failing seed in a simulation's output, and its first line.
func firstFailure(out string) (uint64, string) {
	var best uint64
	var detail string
	for _, m := range failedSeed.FindAllStringSubmatch(out, -1) {
		s, err := strconv.ParseUint(m[1], 10, 64)
		if err == nil && (best == 0 || s < best) {
			what, _, _ := strings.Cut(m[3], "replay:")
			best, detail = s, "step "+m[2]+": "+strings.Join(strings.Fields(what), " ")
		}
	}
	return best, detail
}

// copyModule copies the module's source (not .git, not caches) from src to dst.
func copyModule(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		if d.IsDir() {
			if rel == ".git" || rel == ".cache" || rel == "node_modules" {
				return filepath.SkipDir
			}
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		if !d.Type().IsRegular() {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
}
