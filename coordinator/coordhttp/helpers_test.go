package coordhttp_test

import (
	"encoding/base64"
	"strings"
	"testing"

	"github.com/quotaworks/quota/admission"
)

func encode(b []byte) string { return base64.RawURLEncoding.EncodeToString(b) }

// macOf is the MAC a token's signed text must carry under k's signing key.
func macOf(t *testing.T, k *admission.Keyring, signed string) []byte {
	t.Helper()
	_, mac, err := k.MAC("quota console login token", []byte(signed))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(signed, "qc1.") {
		t.Fatalf("signed text %q", signed)
	}
	return mac
}
