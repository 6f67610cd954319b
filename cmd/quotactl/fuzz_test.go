package main

import (
	"strings"
	"testing"
)

// FuzzParsePairs: "name=number,..." flags (--sku, --allocate, --skew) parse into as many
// names as numbers, each name non-empty and given once, or are refused naming the flag.
func FuzzParsePairs(f *testing.F) {
	for _, s := range []string{"us=40,eu=35,ap=25", "phone=10000", "a=1,a=2", "=3", "x=", "x=1,,y=2", "x=99999999999999999999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		names, nums, err := parsePairs("allocate", []string{s})
		if err != nil {
			if !strings.Contains(err.Error(), "--allocate") {
				t.Fatalf("error without the flag: %v", err)
			}
			return
		}
		if len(names) != len(nums) || len(names) == 0 {
			t.Fatalf("%q → %v %v", s, names, nums)
		}
		seen := map[string]bool{}
		for _, n := range names {
			if n == "" || seen[n] {
				t.Fatalf("%q → names %v", s, names)
			}
			seen[n] = true
		}
	})
}
