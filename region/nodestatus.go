package region

import "time"

// NodeStatus is what one region process says of itself for `quotactl status`: whether it
// leads and under which epoch, and, while it stands by, how fresh its warm copy is.
type NodeStatus struct {
	// Leading is true while this process is the region's writer; Epoch is its term then.
	Leading bool
	Epoch   int64
	// Refresh is Config.StandbyRefresh: how often a standby refreshes its copy (negative:
	// a cold standby, which keeps none).
	Refresh time.Duration
	// RefreshAge is how long ago (by Config.Clock) the warm copy was last brought up to
	// date; negative when it never was (a standby just started, a cold one, or a process that
	// has led since it started).
	RefreshAge time.Duration
}

// NodeStatus reports the process's part in its region (leader or standby) now.
func (r *Region) NodeStatus() NodeStatus {
	st := NodeStatus{Refresh: r.cfg.StandbyRefresh}
	r.leadership.mu.Lock()
	if r.leadership.w != nil {
		st.Leading, st.Epoch = true, r.leadership.w.epoch
	}
	r.leadership.mu.Unlock()
	st.RefreshAge = -1
	if ns := r.warmCopy.refreshedAt.Load(); ns != 0 {
		st.RefreshAge = max(r.cfg.Clock.Now().Sub(time.Unix(0, ns)), 0)
	}
	return st
}
