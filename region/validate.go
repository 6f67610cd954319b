package region

import (
	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/transfer"
)

func checkIDs(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if r := transfer.CheckID(fields[i+1]); r != "" {
			return apierr.Invalid(fields[i], "%s", r)
		}
	}
	return nil
}

func checkQuantity(field string, q transfer.Units) error {
	if q <= 0 {
		return apierr.Invalid(field, "must be positive, got %d", q)
	}
	if q > transfer.MaxUnits {
		return apierr.Invalid(field, "%d is more than the maximum %d", q, transfer.MaxUnits)
	}
	return nil
}
