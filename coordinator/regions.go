package coordinator

import "fmt"

// regionSet is the configured regions, in order and by name.
type regionSet struct {
	list   []RegionLink
	byName map[string]RegionLink
}

// newRegionSet indexes regions (already validated: names unique).
func newRegionSet(regions []RegionLink) *regionSet {
	s := &regionSet{list: regions, byName: map[string]RegionLink{}}
	for _, r := range regions {
		s.byName[r.Name] = r
	}
	return s
}

// link is the configured region named region, or an error naming it.
func (s *regionSet) link(region string) (RegionLink, error) {
	l, ok := s.byName[region]
	if !ok {
		return l, fmt.Errorf("region %q is not configured", region)
	}
	return l, nil
}

// names lists the regions' names in order.
func (s *regionSet) names() []string {
	names := make([]string, len(s.list))
	for i, r := range s.list {
		names[i] = r.Name
	}
	return names
}

// index is the position of region name in the configuration (len when not configured).
func (s *regionSet) index(name string) int {
	for i, r := range s.list {
		if r.Name == name {
			return i
		}
	}
	return len(s.list)
}
