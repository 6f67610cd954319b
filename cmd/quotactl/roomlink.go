package main

import (
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/quotaworks/quota/admission"
	"github.com/quotaworks/quota/transfer"
	"github.com/spf13/cobra"
)

// maxRoomLinkTTL is the longest life a room link may be given: a region refuses links that
// expire further ahead (admission.MaxEntryTTL).
const maxRoomLinkTTL = admission.MaxEntryTTL

// roomLinkCmd makes the signed entry link a storefront sends a shopper to a region's
// waiting-room page with.
func roomLinkCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "room-link", Short: "Make a signed link that takes a shopper into a sale's waiting-room page",
		Args: cobra.NoArgs, RunE: withEnv(runRoomLink),
		Example: `  quotactl room-link --sale drop --user alice --room https://127.0.0.1:8501`}
	f := cmd.Flags()
	f.String("sale", "", "sale id (required)")
	f.String("user", "", "the shopper's user id, as the store authenticated them (required)")
	f.Duration("ttl", 10*time.Minute, "how long the link lets the shopper in (at most 24h)")
	f.String("room", "https://127.0.0.1:8501", "the region's waiting-room address (quotad region --room-listen; quotad dev: us 8501, eu 8502, ap 8503)")
	f.String("ticket-keys", ".dev/tickets.keys", "the cluster's ticket key file, as quotad region's --ticket-keys")
	cmd.Long = `A storefront that has authenticated a shopper sends their browser to the region's waiting-room
page with a link it signs with the cluster's ticket keys: /room/<sale>?user=U&exp=T&sig=K.MAC.
The page enters the line for U only with a link that verifies and has not expired. A store
makes these links in its own code (docs/storefront.md, "The waiting-room page", says how);
this command makes one by hand, for a test or a demonstration.`
	return cmd
}

func runRoomLink(e *env) error {
	sale, user, ttl := e.v.GetString("sale"), e.v.GetString("user"), e.v.GetDuration("ttl")
	if why := transfer.CheckID(sale); why != "" {
		return usage("--sale %q: %s", sale, why)
	}
	if why := transfer.CheckID(user); why != "" {
		return usage("--user %q: %s", user, why)
	}
	if ttl < time.Second || ttl > maxRoomLinkTTL {
		return usage("--ttl %s: must be 1s..%s", ttl, maxRoomLinkTTL)
	}
	room, err := url.Parse(e.v.GetString("room"))
	if err != nil || (room.Scheme != "https" && room.Scheme != "http") || room.Host == "" || room.RawQuery != "" || room.Fragment != "" {
		return usage("--room %q: want the page's base address, such as https://127.0.0.1:8501", e.v.GetString("room"))
	}
	path := e.v.GetString("ticket-keys")
	data, err := os.ReadFile(path)
	if err != nil {
		return usage("--ticket-keys: %v", err)
	}
	keys, err := admission.ParseKeyring(data)
	if err != nil {
		return fmt.Errorf("--ticket-keys %s: %w", path, err)
	}
	expires := time.Now().Add(ttl)
	q, err := keys.SignEntry(sale, user, expires)
	if err != nil {
		return err
	}
	link := strings.TrimSuffix(room.String(), "/") + "/room/" + url.PathEscape(sale) + "?" + q.Encode()
	out := struct {
		Link      string    `json:"link"`
		Sale      string    `json:"sale"`
		User      string    `json:"user"`
		ExpiresAt time.Time `json:"expires_at"`
	}{link, sale, user, expires.Truncate(time.Second).UTC()}
	return e.print(out, func(w io.Writer) { fmt.Fprintln(w, link) })
}
