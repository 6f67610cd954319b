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

// TestParsePairsTakesCommasAndSpaces: a QUOTA_* variable separates list values by spaces, the
// command line by commas; both read the same.
func TestParsePairsTakesCommasAndSpaces(t *testing.T) {
	for _, s := range []string{"us=1,eu=2", "us=1 eu=2", " us=1 ,\teu=2 "} {
		names, nums, err := parsePairs("allocate", []string{s})
		if err != nil || strings.Join(names, ",") != "us,eu" || nums[0] != 1 || nums[1] != 2 {
			t.Errorf("%q → %v %v %v, want us=1 eu=2", s, names, nums, err)
		}
	}
	for _, s := range []string{"", " , ", "us", "us=x"} {
		if _, _, err := parsePairs("allocate", []string{s}); err == nil {
			t.Errorf("%q: no error", s)
		}
	}
}
