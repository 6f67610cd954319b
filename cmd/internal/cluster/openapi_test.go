package cluster_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io"
	"net/http"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/quotaworks/quota/internal/apierr"
	"github.com/quotaworks/quota/internal/trust"
	quotav1 "github.com/quotaworks/quota/proto/quota/v1"
	"github.com/quotaworks/quota/region/regionhttp"
)

// The document and the source of the routes it describes, from this package's directory.
const (
	openAPIFile     = "../../../docs/openapi.yaml"
	regionHTTPRoute = "../../../region/regionhttp/http.go"
)

func loadOpenAPI(t *testing.T) *openapi3.T {
	t.Helper()
	doc, err := openapi3.NewLoader().LoadFromFile(openAPIFile)
	if err != nil {
		t.Fatalf("load %s: %v", openAPIFile, err)
	}
	if err := doc.Validate(context.Background()); err != nil {
		t.Fatalf("%s is not a valid OpenAPI document: %v", openAPIFile, err)
	}
	return doc
}

// edgeRoute is a route the HTTP edge registers: "METHOD /path" and the gRPC method that
// authorizes it.
type edgeRoute struct{ pattern, grpcMethod string }

// sourceRoutes reads the routes regionhttp.Handler registers from its source: every
// route("METHOD /path", svc+"Method", ...) call. A pattern registered on the mux directly,
// other than the catch-all "/" and the operators' metrics (regionhttp.MetricsRoute, no
// storefront call), fails the test: it would escape this check.
func sourceRoutes(t *testing.T) []edgeRoute {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, regionHTTPRoute, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	consts := map[string]string{}
	ast.Inspect(f, func(n ast.Node) bool {
		if vs, ok := n.(*ast.ValueSpec); ok {
			for i, name := range vs.Names {
				if i < len(vs.Values) {
					if lit, ok := vs.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
						consts[name.Name], _ = strconv.Unquote(lit.Value)
					}
				}
			}
		}
		return true
	})
	str := func(e ast.Expr) (string, bool) {
		switch v := e.(type) {
		case *ast.BasicLit:
			if v.Kind == token.STRING {
				s, err := strconv.Unquote(v.Value)
				return s, err == nil
			}
		case *ast.Ident:
			s, ok := consts[v.Name]
			return s, ok
		}
		return "", false
	}
	var out []edgeRoute
	ast.Inspect(f, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok || len(call.Args) == 0 {
			return true
		}
		switch fn := call.Fun.(type) {
		case *ast.Ident:
			if fn.Name != "route" || len(call.Args) < 2 {
				return true
			}
			pattern, ok := str(call.Args[0])
			if !ok {
				t.Errorf("%s: a route whose pattern is not a constant", fset.Position(call.Pos()))
				return true
			}
			method := ""
			if b, ok := call.Args[1].(*ast.BinaryExpr); ok && b.Op == token.ADD {
				x, okx := str(b.X)
				y, oky := str(b.Y)
				if okx && oky {
					method = x + y
				}
			} else if s, ok := str(call.Args[1]); ok {
				method = s
			}
			if method == "" {
				t.Errorf("%s: route %s: its gRPC method is not a constant", fset.Position(call.Pos()), pattern)
			}
			out = append(out, edgeRoute{pattern, method})
		case *ast.SelectorExpr:
			if fn.Sel.Name != "Handle" && fn.Sel.Name != "HandleFunc" {
				return true
			}
			if p, ok := str(call.Args[0]); ok && p != "/" && p != regionhttp.MetricsRoute { // the operators' route: not in the document
				t.Errorf("%s: %s is registered outside route(): this test cannot see its gRPC method", fset.Position(call.Pos()), p)
			}
		}
		return true
	})
	if len(out) == 0 {
		t.Fatalf("no route(...) call found in %s", regionHTTPRoute)
	}
	return out
}

// errorCodes returns the codes an error response lists: its schema is ErrorBody, with the
// codes as an enum of error.code in an allOf beside it.
func errorCodes(resp *openapi3.Response) ([]string, error) {
	mt := resp.Content.Get("application/json")
	if mt == nil || mt.Schema == nil {
		return nil, errors.New("no application/json schema")
	}
	s := mt.Schema.Value
	if len(s.AllOf) != 2 || s.AllOf[0].Ref != "#/components/schemas/ErrorBody" {
		return nil, errors.New("schema is not allOf [ErrorBody, the codes]")
	}
	e := s.AllOf[1].Value.Properties["error"]
	if e == nil || e.Value.Properties["code"] == nil {
		return nil, errors.New("allOf's second schema has no error.code")
	}
	var out []string
	for _, v := range e.Value.Properties["code"].Value.Enum {
		c, ok := v.(string)
		if !ok {
			return nil, fmt.Errorf("code %v is not a string", v)
		}
		out = append(out, c)
	}
	if len(out) == 0 {
		return nil, errors.New("error.code has no enum")
	}
	return out, nil
}

// errorStatuses is each error code's HTTP statuses, from the one table itself (apierr.HTTP).
func errorStatuses() map[string][]int {
	out := map[string][]int{}
	add := func(err error) {
		code, body := apierr.HTTP(err)
		if !slices.Contains(out[body.Error.Code], code) {
			out[body.Error.Code] = append(out[body.Error.Code], code)
		}
	}
	for _, e := range []error{apierr.ErrInvalid, apierr.ErrAborted, apierr.ErrSoldOut, apierr.ErrRegionExhausted,
		apierr.ErrLimitExceeded, apierr.ErrHoldExpired, apierr.ErrFenced, apierr.ErrNotLeader, apierr.ErrTicketUsed,
		apierr.ErrAlreadyExists, apierr.ErrNotFound, apierr.ErrNotOpen, apierr.ErrConflict, apierr.ErrUnknownOutcome,
		apierr.ErrUnauthenticated, apierr.ErrTicketInvalid, apierr.ErrPermissionDenied, apierr.ErrOverloaded,
		apierr.ErrTooManyKeys, apierr.ErrPaused, apierr.ErrBoundElsewhere, context.DeadlineExceeded, context.Canceled,
		errors.New("a bug"), status.Error(codes.Unimplemented, "not implemented")} {
		add(e)
	}
	return out
}

// TestOpenAPIDocument checks docs/openapi.yaml on its own: a valid OpenAPI 3.0 document whose
// operations are exactly the routes regionhttp registers, each naming the gRPC method that
// authorizes it and that method's roles, and whose error responses list only codes that the
// error table answers with that status.
func TestOpenAPIDocument(t *testing.T) {
	doc := loadOpenAPI(t)
	if doc.OpenAPI != "3.0.3" {
		t.Errorf("openapi %q, want 3.0.3", doc.OpenAPI)
	}
	ops := map[string]*openapi3.Operation{}
	for path, item := range doc.Paths.Map() {
		for method, op := range item.Operations() {
			ops[method+" "+path] = op
		}
	}
	registered := map[string]bool{}
	for _, r := range sourceRoutes(t) {
		registered[r.pattern] = true
		op := ops[r.pattern]
		if op == nil {
			t.Errorf("route %s (regionhttp) is not in %s", r.pattern, openAPIFile)
			continue
		}
		if got, _ := op.Extensions["x-grpc-method"].(string); got != r.grpcMethod {
			t.Errorf("%s: x-grpc-method %q, want %q", r.pattern, got, r.grpcMethod)
		}
		var roles []string
		if list, ok := op.Extensions["x-roles"].([]any); ok {
			for _, v := range list {
				s, _ := v.(string)
				roles = append(roles, s)
			}
		}
		var want []string
		for _, role := range trust.Methods[r.grpcMethod] {
			want = append(want, string(role))
		}
		sort.Strings(roles)
		sort.Strings(want)
		if !slices.Equal(roles, want) {
			t.Errorf("%s: x-roles %v, but trust.Methods allows %v", r.pattern, roles, want)
		}
	}
	for k := range ops {
		if !registered[k] {
			t.Errorf("%s is in %s but regionhttp registers no such route", k, openAPIFile)
		}
	}

	statuses := errorStatuses()
	for k, op := range ops {
		for st, ref := range op.Responses.Map() {
			code, err := strconv.Atoi(st)
			if err != nil {
				t.Errorf("%s: response %q: give each status, not a range or default", k, st)
				continue
			}
			if code < 400 {
				if code != http.StatusNotModified && ref.Value.Content.Get("application/json") == nil {
					t.Errorf("%s %d: no application/json content", k, code)
				}
				continue
			}
			codes, err := errorCodes(ref.Value)
			if err != nil {
				t.Errorf("%s %d: %v", k, code, err)
				continue
			}
			for _, c := range codes {
				if !slices.Contains(statuses[c], code) {
					t.Errorf("%s %d lists %s, which the error table answers with %v", k, code, c, statuses[c])
				}
			}
		}
		if op.Responses.Status(401) == nil || op.Responses.Status(403) == nil {
			t.Errorf("%s: every route answers 401 and 403; document them", k)
		}
	}
}

// specCheck drives the edge and holds every exchange to the document.
type specCheck struct {
	t       *testing.T
	doc     *openapi3.T
	router  routers.Router
	seen    map[string]map[int]bool // "METHOD /path" → statuses answered
	errBody *openapi3.Schema
}

func newSpecCheck(t *testing.T, bases ...string) *specCheck {
	doc := loadOpenAPI(t)
	doc.Servers = nil
	for _, b := range bases {
		doc.Servers = append(doc.Servers, &openapi3.Server{URL: b})
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	return &specCheck{t: t, doc: doc, router: r, seen: map[string]map[int]bool{},
		errBody: doc.Components.Schemas["ErrorBody"].Value}
}

// exchange is one request and what it must get.
type exchange struct {
	c      *http.Client
	method string
	url    string
	// body is sent as JSON; a []byte is sent as it is; nil sends none.
	body   any
	header map[string]string
	// status is the status wanted (0: any the document allows); code the error code wanted.
	status int
	code   string
	// invalid says the document must refuse the request (the server answers 400 for it).
	invalid bool
	// unrouted says the request is for no route of the document (the edge answers 404).
	unrouted bool
}

func (s *specCheck) newRequest(ex exchange, body []byte) *http.Request {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(ex.method, ex.url, rd)
	if err != nil {
		s.t.Fatal(err)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for k, v := range ex.header {
		req.Header.Set(k, v)
	}
	return req
}

// do sends ex, validates the request and the answer against the document, and checks the
// status and code wanted.
func (s *specCheck) do(ex exchange) answer {
	t := s.t
	t.Helper()
	var body []byte
	switch b := ex.body.(type) {
	case nil:
	case []byte:
		body = b
	default:
		var err error
		if body, err = json.Marshal(b); err != nil {
			t.Fatal(err)
		}
	}
	name := ex.method + " " + strings.TrimPrefix(strings.TrimPrefix(ex.url, "https://"), "http://")
	ctx := context.Background()

	vreq := s.newRequest(ex, body)
	route, params, routeErr := s.router.FindRoute(vreq)
	var in *openapi3filter.RequestValidationInput
	switch {
	case ex.unrouted:
		if routeErr == nil {
			t.Errorf("%s: the document has a route for it (%s %s)", name, route.Method, route.Path)
		}
	case routeErr != nil:
		t.Errorf("%s: no route in the document: %v", name, routeErr)
	default:
		in = &openapi3filter.RequestValidationInput{Request: vreq, PathParams: params, Route: route,
			Options: &openapi3filter.Options{MultiError: true}}
		err := openapi3filter.ValidateRequest(ctx, in)
		if ex.invalid && err == nil {
			t.Errorf("%s %s: the document accepts this request, which the edge refuses", name, body)
		} else if !ex.invalid && err != nil {
			t.Errorf("%s %s: the document refuses the request: %v", name, body, err)
		}
	}

	resp, err := ex.c.Do(s.newRequest(ex, body))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	raw, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	a := answer{code: resp.StatusCode, header: resp.Header}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &a.body); err != nil {
			t.Errorf("%s: %d, not JSON: %q", name, resp.StatusCode, raw)
		}
	}

	switch {
	case in != nil && resp.StatusCode == http.StatusNotModified:
		// openapi3filter does not validate a 304: its headers are checked here.
		if err := check304(route, resp.Header, raw); err != nil {
			t.Errorf("%s: 304: %v", name, err)
		}
	case in != nil:
		out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode, Header: resp.Header,
			Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true}}
		out.SetBodyBytes(raw)
		if err := openapi3filter.ValidateResponse(ctx, out); err != nil {
			t.Errorf("%s: the answer %d %s is not as documented: %v", name, resp.StatusCode, raw, err)
		}
	default: // no route: the answer must still be the one error shape
		var v any
		if err := json.Unmarshal(raw, &v); err != nil || s.errBody.VisitJSON(v) != nil {
			t.Errorf("%s: %d %s is not an ErrorBody", name, resp.StatusCode, raw)
		}
	}
	if in != nil {
		k := route.Method + " " + route.Path
		if s.seen[k] == nil {
			s.seen[k] = map[int]bool{}
		}
		s.seen[k][resp.StatusCode] = true
	}

	if ex.invalid && resp.StatusCode != http.StatusBadRequest {
		t.Errorf("%s %s: %d %s; a request the document refuses should be answered 400", name, body, resp.StatusCode, raw)
	}
	if ex.status != 0 && resp.StatusCode != ex.status {
		t.Errorf("%s %s: %d %s, want %d %s", name, body, resp.StatusCode, raw, ex.status, ex.code)
	}
	if ex.code != "" && a.errCode() != ex.code {
		t.Errorf("%s %s: code %q (%d %s), want %s", name, body, a.errCode(), resp.StatusCode, raw, ex.code)
	}
	return a
}

// check304 checks a 304 against the route's documented 304: its required headers there and
// as their schemas say, and no body.
func check304(route *routers.Route, h http.Header, body []byte) error {
	ref := route.Operation.Responses.Status(http.StatusNotModified)
	if ref == nil {
		return errors.New("not documented")
	}
	if len(body) != 0 {
		return fmt.Errorf("a body: %q", body)
	}
	for name, hr := range ref.Value.Headers {
		v := h.Get(name)
		if v == "" {
			if hr.Value.Required {
				return fmt.Errorf("no %s header", name)
			}
			continue
		}
		if err := hr.Value.Schema.Value.VisitJSON(v); err != nil {
			return fmt.Errorf("header %s %q: %v", name, v, err)
		}
	}
	return nil
}

// admit enters user at base and polls until the wait ends, checking each exchange; it
// returns the last answer.
func (s *specCheck) admit(c *http.Client, base, sale, user string) answer {
	s.t.Helper()
	a := s.do(exchange{c: c, method: "POST", url: base + "/v1/sales/" + sale + "/admissions", body: map[string]string{"user_id": user},
		status: http.StatusAccepted})
	id := a.str("admission_id")
	deadline := time.Now().Add(15 * time.Second)
	for a.code == http.StatusAccepted && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		a = s.do(exchange{c: c, method: "GET", url: base + "/v1/sales/" + sale + "/admissions/" + id})
	}
	return a
}

// admitBound is admit for a buyer bound to another region: a room that has not heard the
// binding within its wait admits them, then withdraws the admission when it answers
// (region/doorbind.go); it polls through that, 10 s at most.
func (s *specCheck) admitBound(c *http.Client, base, sale, user string) answer {
	s.t.Helper()
	a := s.admit(c, base, sale, user)
	id := a.str("admission_id")
	for deadline := time.Now().Add(10 * time.Second); a.code == http.StatusOK && id != "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		a = s.do(exchange{c: c, method: "GET", url: base + "/v1/sales/" + sale + "/admissions/" + id})
	}
	return a
}

// waitlist sells a sale of 2 units out at base, sees its waiting room answer SOLD_OUT, puts a
// buyer on the waitlist, releases a hold and takes the offer of it.
func (s *specCheck) waitlist(c *http.Client, base string) {
	t := s.t
	t.Helper()
	adm := s.admit(c, base, "rush", "first")
	hold := s.do(exchange{c: c, method: "POST", url: base + "/v1/sales/rush/reservations", status: 201,
		body: map[string]any{"ticket": adm.str("ticket"), "sku": "phone", "quantity": 2, "request_key": "r1"}})
	var closed answer
	for i := 0; closed.errCode() != "SOLD_OUT"; i++ { // the coordinator's flag takes a second or so
		if i == 50 {
			t.Fatalf("no SOLD_OUT 5 s after the last unit went: %d %v", closed.code, closed.body)
		}
		time.Sleep(100 * time.Millisecond)
		closed = s.do(exchange{c: c, method: "POST", url: base + "/v1/sales/rush/admissions", body: map[string]string{"user_id": "late" + strconv.Itoa(i)}})
	}
	join := s.do(exchange{c: c, method: "POST", url: base + "/v1/sales/rush/waitlist", body: map[string]string{"user_id": "wendy", "sku": "phone"},
		status: http.StatusAccepted})
	if join.str("sku") != "phone" || join.body["position"] != 1.0 {
		t.Errorf("on the waitlist: %v", join.body)
	}
	poll := base + "/v1/sales/rush/admissions/" + join.str("admission_id")
	s.do(exchange{c: c, method: "GET", url: poll, status: http.StatusAccepted})
	s.do(exchange{c: c, method: "POST", url: base + "/v1/holds/" + hold.str("hold_id") + "/release", status: 200})
	offer := join
	for deadline := time.Now().Add(5 * time.Second); offer.str("ticket") == "" && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		offer = s.do(exchange{c: c, method: "GET", url: poll})
	}
	if offer.code != 200 || offer.str("state") != "admitted" || offer.str("sku") != "phone" {
		t.Fatalf("the waitlisted buyer's offer: %d %v", offer.code, offer.body)
	}
	// (Joining again now could answer CONFLICT: the returned units count as available, and
	// the coordinator may have lowered the drained flag. The poll is what a buyer uses.)
	s.do(exchange{c: c, method: "POST", url: base + "/v1/sales/rush/reservations", status: 201,
		body: map[string]any{"ticket": offer.str("ticket"), "sku": "phone", "quantity": 2, "request_key": "w1"}})
	if used := s.do(exchange{c: c, method: "GET", url: poll, status: http.StatusOK}); used.str("state") != "used" {
		t.Errorf("the claimed offer: %v", used.body)
	}
}

// createOpenAPISale creates sale with the request's terms and splits it over weights.
func createOpenAPISale(t *testing.T, coord quotav1.CoordinatorServiceClient, req *quotav1.CreateSaleRequest, weights map[string]int64) {
	t.Helper()
	ctx := context.Background()
	if _, err := coord.CreateSale(ctx, req); err != nil {
		t.Fatal(err)
	}
	areq := &quotav1.AllocateRequest{SaleId: req.GetSaleId(), RequestId: "alloc-" + req.GetSaleId()}
	for r, w := range weights {
		areq.Weights = append(areq.Weights, &quotav1.RegionWeight{Region: r, Weight: w})
	}
	if _, err := coord.Allocate(ctx, areq); err != nil {
		t.Fatal(err)
	}
}

// TestOpenAPIEdge drives a dev cluster of two regions through every route of the document,
// the happy paths and the refusals that can be provoked, and holds every request and every
// answer (status, headers, body) to docs/openapi.yaml; it fails if an operation of the
// document was never exercised.
func TestOpenAPIEdge(t *testing.T) {
	d := startDev(t, "us", "eu")
	us, eu := edgeURL(d, "us"), edgeURL(d, "eu")
	s := newSpecCheck(t, us, eu)
	coord := quotav1.NewCoordinatorServiceClient(dial(t, d.Coordinator.Addr(), trust.Operator))
	both := map[string]int64{"us": 1, "eu": 1}
	createWaitingSale(t, d, "drop", 10, 100, both) // 5 phones a region, 2 a buyer, tickets of 30 s
	now := time.Now()
	for _, req := range []*quotav1.CreateSaleRequest{
		{SaleId: "open", PerUserLimit: 2, HoldTtlMs: 60000}, // no waiting room
		{SaleId: "later", PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 10, OpensAt: timestamppb.New(now.Add(time.Hour))},
		{SaleId: "soon", PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 10, OpensAt: timestamppb.New(now.Add(5 * time.Minute))},
		{SaleId: "stop", PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 10},
	} {
		req.Skus = []*quotav1.SkuTotal{{Sku: "phone", Total: 10}}
		createOpenAPISale(t, coord, req, both)
	}
	createOpenAPISale(t, coord, &quotav1.CreateSaleRequest{SaleId: "rush", Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 2}},
		PerUserLimit: 2, HoldTtlMs: 60000, AdmitRate: 100, TicketTtlMs: 30000}, map[string]int64{"us": 1}) // all at us
	if resp, err := coord.PauseSale(context.Background(), &quotav1.PauseSaleRequest{SaleId: "stop", Reason: "openapi test"}); err != nil {
		t.Fatal(err)
	} else if len(resp.GetUnreached()) != 0 {
		t.Fatalf("pause did not reach %v", resp.GetUnreached())
	}

	shop := httpClient(t, trust.Storefront)
	anon := httpClient(t, "")
	op := httpClient(t, trust.Operator)
	coordC := httpClient(t, trust.Coordinator)
	get := func(c *http.Client, url string, status int, code string) answer {
		return s.do(exchange{c: c, method: "GET", url: url, status: status, code: code})
	}
	post := func(c *http.Client, url string, body any, status int, code string) answer {
		return s.do(exchange{c: c, method: "POST", url: url, body: body, status: status, code: code})
	}
	bad := func(url string, body any) answer {
		return s.do(exchange{c: shop, method: "POST", url: url, body: body, status: 400, code: "INVALID_ARGUMENT", invalid: true})
	}

	// Health and roles.
	get(shop, us+"/v1/ping", 200, "")
	get(anon, us+"/v1/ping", 401, "UNAUTHENTICATED")
	get(coordC, us+"/v1/ping", 403, "PERMISSION_DENIED")

	// The sale's page and its cache.
	page := get(shop, us+"/v1/sales/drop", 200, "")
	s.do(exchange{c: shop, method: "GET", url: us + "/v1/sales/drop", header: map[string]string{"If-None-Match": page.header.Get("ETag")},
		status: http.StatusNotModified})
	get(op, us+"/v1/sales/drop", 200, "")
	get(anon, us+"/v1/sales/drop", 401, "UNAUTHENTICATED")
	get(shop, us+"/v1/sales/nosuch", 404, "NOT_FOUND")
	s.do(exchange{c: shop, method: "GET", url: us + "/v1/sales/-bad", status: 400, code: "INVALID_ARGUMENT", invalid: true})
	if p := get(shop, us+"/v1/sales/open", 200, ""); p.body["ticket_ttl_ms"] != nil || p.body["admit_rate"] != 0.0 {
		t.Errorf("a sale without a waiting room: %v", p.body)
	}
	if p := get(shop, us+"/v1/sales/stop", 200, ""); p.body["paused"] != true {
		t.Errorf("a paused sale's page: %v", p.body)
	}

	// The waiting room: queued (202), admitted (200 on a poll, 201 on entering again).
	enterDrop := us + "/v1/sales/drop/admissions"
	first := s.do(exchange{c: shop, method: "POST", url: enterDrop, body: map[string]string{"user_id": "alice"},
		header: map[string]string{"X-Client-Address": "203.0.113.7"}, status: http.StatusAccepted})
	a := first
	for deadline := time.Now().Add(15 * time.Second); a.code == http.StatusAccepted && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		a = get(shop, us+"/v1/sales/drop/admissions/"+first.str("admission_id"), 0, "")
	}
	if a.code != 200 || a.str("state") != "admitted" || a.str("ticket") == "" {
		t.Fatalf("alice's admission: %d %v", a.code, a.body)
	}
	if again := post(shop, enterDrop, map[string]string{"user_id": "alice"}, 201, ""); again.str("admission_id") != a.str("admission_id") {
		t.Errorf("entering again: %v, then %v", a.body, again.body)
	}
	post(op, enterDrop, map[string]string{"user_id": "alice"}, 403, "PERMISSION_DENIED")
	bad(enterDrop, map[string]string{"user": "alice"})
	bad(enterDrop, []byte{})
	bad(enterDrop, []byte("[]"))
	bad(enterDrop, map[string]string{"user_id": "no spaces"})
	get(shop, us+"/v1/sales/drop/admissions/nosuchadmission", 404, "NOT_FOUND")
	// Each buyer may enter 5 times at once: these refusals are each another buyer's.
	post(shop, us+"/v1/sales/nosuch/admissions", map[string]string{"user_id": "u1"}, 404, "NOT_FOUND")
	post(shop, us+"/v1/sales/later/admissions", map[string]string{"user_id": "u2"}, 409, "NOT_OPEN")
	post(shop, us+"/v1/sales/open/admissions", map[string]string{"user_id": "u3"}, 409, "CONFLICT")
	get(shop, us+"/v1/sales/open/admissions/nosuchadmission", 409, "CONFLICT")
	post(shop, us+"/v1/sales/stop/admissions", map[string]string{"user_id": "u4"}, 409, "PAUSED")
	if pre := post(shop, us+"/v1/sales/soon/admissions", map[string]string{"user_id": "u5"}, 202, ""); pre.body["position"] != nil ||
		pre.header.Get("Retry-After") != "5" {
		t.Errorf("the pre-queue: %v %v; want no position and Retry-After 5", pre.header, pre.body)
	} else {
		get(shop, us+"/v1/sales/soon/admissions/"+pre.str("admission_id"), 202, "")
	}
	var flood answer // one buyer knocking too often: 5 at once, then 2 a second
	for i := 0; i < 10 && flood.code != http.StatusTooManyRequests; i++ {
		flood = post(shop, enterDrop, map[string]string{"user_id": "eager"}, 0, "")
	}
	if flood.code != http.StatusTooManyRequests || flood.errCode() != "OVERLOADED" {
		t.Errorf("a buyer entering 10 times at once: %d %v", flood.code, flood.body)
	}

	// Reservations with the ticket: made, replayed, refused.
	ticket := a.str("ticket")
	reserveDrop := us + "/v1/sales/drop/reservations"
	res := post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 2, "request_key": "k1"}, 201, "")
	if res.str("state") != "held" || res.str("admission_id") != a.str("admission_id") || res.str("user_id") != "alice" {
		t.Errorf("reserve: %v", res.body)
	}
	if rep := post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 2, "request_key": "k1"}, 200, ""); rep.str("hold_id") != res.str("hold_id") {
		t.Errorf("replay: %v", rep.body)
	}
	post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k1"}, 409, "ALREADY_EXISTS")
	post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k2"}, 409, "TICKET_USED")
	post(shop, reserveDrop, map[string]any{"ticket": ticket[:len(ticket)-2] + "AA", "sku": "phone", "quantity": 1, "request_key": "k3"}, 401, "TICKET_INVALID")
	post(shop, reserveDrop, map[string]any{"ticket": "not-a-ticket", "sku": "phone", "quantity": 1, "request_key": "k3"}, 401, "TICKET_INVALID")
	post(shop, eu+"/v1/sales/drop/reservations", map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k4"}, 401, "TICKET_INVALID")
	post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "tablet", "quantity": 1, "request_key": "k5"}, 404, "NOT_FOUND")
	post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 3, "request_key": "k6"}, 400, "INVALID_ARGUMENT")
	post(anon, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k7"}, 401, "UNAUTHENTICATED")
	post(shop, reserveDrop, map[string]any{"user_id": "alice", "sku": "phone", "quantity": 1, "request_key": "k8"}, 401, "TICKET_INVALID")
	bad(reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": "two", "request_key": "k9"})
	bad(reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 0, "request_key": "k10"})
	post(shop, reserveDrop, map[string]any{"ticket": ticket, "sku": "phone", "quantity": 1, "request_key": "k11", "user_id": "mallory"}, 400, "INVALID_ARGUMENT")

	// The buyer is bound to us: eu's waiting room sends them there, on the poll and after.
	if b := s.admitBound(shop, eu, "drop", "alice"); b.code != 409 || b.errCode() != "BOUND_ELSEWHERE" || b.errField("region") != "us" {
		t.Errorf("alice at eu: %d %v", b.code, b.body)
	}
	if b := post(shop, eu+"/v1/sales/drop/admissions", map[string]string{"user_id": "alice"}, 409, "BOUND_ELSEWHERE"); b.errField("region") != "us" {
		t.Errorf("alice entering eu again: %v", b.body)
	}

	// Holds: read, paid, released, refunded.
	hold := res.str("hold_id")
	get(shop, us+"/v1/holds/"+hold, 200, "")
	if conf := post(shop, us+"/v1/holds/"+hold+"/confirm", map[string]string{"payment_id": "pay-1"}, 200, ""); conf.str("outcome") != "sold" {
		t.Errorf("confirm: %v", conf.body)
	}
	if g := get(op, us+"/v1/holds/"+hold, 200, ""); g.str("state") != "sold" || g.str("payment_id") != "pay-1" {
		t.Errorf("the sold hold: %v", g.body)
	}
	s.do(exchange{c: shop, method: "POST", url: us + "/v1/holds/" + hold + "/release", status: 409, code: "CONFLICT"})
	bad(us+"/v1/holds/"+hold+"/confirm", map[string]string{})
	get(shop, us+"/v1/holds/us.0000000000000000000000000000", 404, "NOT_FOUND")
	get(shop, us+"/v1/holds/"+strings.Replace(hold, "us.", "eu.", 1), 404, "NOT_FOUND")
	s.do(exchange{c: shop, method: "GET", url: us + "/v1/holds/nonsense", status: 400, code: "INVALID_ARGUMENT", invalid: true})
	post(coordC, us+"/v1/holds/"+hold+"/confirm", map[string]string{"payment_id": "pay-1"}, 403, "PERMISSION_DENIED")

	bob := s.admit(shop, us, "drop", "bob")
	if bob.str("state") != "admitted" {
		t.Fatalf("bob's admission: %d %v", bob.code, bob.body)
	}
	bres := post(shop, reserveDrop, map[string]any{"ticket": bob.str("ticket"), "sku": "phone", "quantity": 1, "request_key": "b1"}, 201, "")
	bhold := us + "/v1/holds/" + bres.str("hold_id")
	if used := get(shop, us+"/v1/sales/drop/admissions/"+bob.str("admission_id"), 200, ""); used.str("state") != "used" {
		t.Errorf("bob's admission after his reservation: %v", used.body)
	}
	post(shop, enterDrop, map[string]string{"user_id": "bob"}, 200, "") // used: no second ticket
	bad(bhold+"/release", map[string]int{"quantity": 1})
	if rel := s.do(exchange{c: shop, method: "POST", url: bhold + "/release", status: 200}); rel.str("state") != "released" {
		t.Errorf("release: %v", rel.body)
	}
	post(shop, bhold+"/release", map[string]any{}, 200, "") // again, with the empty body: as it is
	if conf := post(shop, bhold+"/confirm", map[string]string{"payment_id": "pay-2"}, 200, ""); conf.str("outcome") != "refund" || conf.str("reason") == "" {
		t.Errorf("confirm of a released hold: %v", conf.body)
	}

	// A buyer's holds at the region: alice's sold one; bob's released one; none for carol yet.
	buyerHolds := func(c *http.Client, user, query string, status int, code string) answer {
		return get(c, us+"/v1/sales/drop/buyers/"+user+"/holds"+query, status, code)
	}
	if l := buyerHolds(shop, "alice", "", 200, ""); !holdsAre(l, hold+"=sold") {
		t.Errorf("alice's holds: %v", l.body)
	}
	if l := buyerHolds(op, "bob", "?limit=1", 200, ""); !holdsAre(l, bres.str("hold_id")+"=released") {
		t.Errorf("bob's holds: %v", l.body)
	}
	if l := buyerHolds(shop, "carol", "", 200, ""); !holdsAre(l) {
		t.Errorf("carol's holds: %v", l.body)
	}
	s.do(exchange{c: shop, method: "GET", url: us + "/v1/sales/drop/buyers/bob/holds?limit=0", status: 400, code: "INVALID_ARGUMENT", invalid: true})
	buyerHolds(coordC, "bob", "", 403, "PERMISSION_DENIED")

	// This region's pool runs short: 3 left, carol takes 2, dave asks 2.
	for _, buyer := range []struct{ user, code string }{{"carol", ""}, {"dave", "REGION_EXHAUSTED"}} {
		adm := s.admit(shop, us, "drop", buyer.user)
		want := 201
		if buyer.code != "" {
			want = 409
		}
		post(shop, reserveDrop, map[string]any{"ticket": adm.str("ticket"), "sku": "phone", "quantity": 2, "request_key": "x"}, want, buyer.code)
	}

	// The waitlist: refused while units are available; once none is, the room answers
	// SOLD_OUT and a returned unit is offered to the first on the waitlist.
	waitDrop := us + "/v1/sales/drop/waitlist"
	post(shop, waitDrop, map[string]string{"user_id": "wendy", "sku": "phone"}, 409, "CONFLICT")
	post(shop, waitDrop, map[string]string{"user_id": "wendy", "sku": "tablet"}, 404, "NOT_FOUND")
	bad(waitDrop, map[string]string{"user_id": "wendy"})
	s.waitlist(shop, us)

	// Carts: held whole or refused naming the line, read, paid and released whole.
	createOpenAPISale(t, coord, &quotav1.CreateSaleRequest{SaleId: "carts", PerUserLimit: 2, HoldTtlMs: 60000,
		Skus: []*quotav1.SkuTotal{{Sku: "phone", Total: 3}, {Sku: "case", Total: 1}}}, map[string]int64{"us": 1})
	s.carts(us, shop)

	// No route: the one error shape still.
	s.do(exchange{c: shop, method: "GET", url: us + "/v1/nowhere", status: 404, code: "NOT_FOUND", unrouted: true})
	s.do(exchange{c: shop, method: "DELETE", url: us + "/v1/sales/drop", status: 404, code: "NOT_FOUND", unrouted: true})

	// Every operation of the document was exercised.
	for path, item := range s.doc.Paths.Map() {
		for method := range item.Operations() {
			k := method + " " + path
			if len(s.seen[k]) == 0 {
				t.Errorf("%s is in the document but was never exercised", k)
				continue
			}
			var sts []int
			for st := range s.seen[k] {
				sts = append(sts, st)
			}
			sort.Ints(sts)
			t.Logf("%-45s %v", k, sts)
		}
	}
}

// carts drives the cart routes at base's sale "carts" (3 phones, 1 case, no waiting room).
func (s *specCheck) carts(base string, shop *http.Client) {
	t := s.t
	post := func(url string, body any, status int, code string) answer {
		return s.do(exchange{c: shop, method: "POST", url: url, body: body, status: status, code: code})
	}
	get := func(url string, status int, code string) answer {
		return s.do(exchange{c: shop, method: "GET", url: url, status: status, code: code})
	}
	reserve := base + "/v1/sales/carts/reservations"
	both := []map[string]any{{"sku": "phone", "quantity": 1}, {"sku": "case", "quantity": 1}}
	cart := post(reserve, map[string]any{"user_id": "cara", "lines": both, "request_key": "c1"}, 201, "")
	holds, _ := cart.body["holds"].([]any)
	if id := cart.str("cart_id"); id == "" || len(holds) != 2 || holds[0].(map[string]any)["hold_id"] != id {
		t.Fatalf("a cart: %v", cart.body)
	}
	id := cart.str("cart_id")
	if rep := post(reserve, map[string]any{"user_id": "cara", "lines": both, "request_key": "c1"}, 200, ""); rep.str("cart_id") != id {
		t.Errorf("the cart's replay: %v", rep.body)
	}
	post(reserve, map[string]any{"user_id": "cara", "lines": both[:1], "request_key": "c1"}, 409, "ALREADY_EXISTS")
	refused := post(reserve, map[string]any{"user_id": "dan", "lines": both, "request_key": "c1"}, 409, "")
	if c := refused.errCode(); (c != "REGION_EXHAUSTED" && c != "SOLD_OUT") || refused.errField("sku") != "case" {
		t.Errorf("a cart whose case is gone: %v; want REGION_EXHAUSTED or SOLD_OUT naming sku case", refused.body)
	}
	s.do(exchange{c: shop, method: "POST", url: reserve, body: map[string]any{"user_id": "dan", "lines": []any{}, "request_key": "c2"},
		status: 400, code: "INVALID_ARGUMENT", invalid: true})
	post(reserve, map[string]any{"user_id": "dan", "lines": both, "sku": "phone", "request_key": "c2"}, 400, "INVALID_ARGUMENT")
	post(reserve, map[string]any{"user_id": "dan", "lines": []map[string]any{both[0], both[0]}, "request_key": "c2"}, 400, "INVALID_ARGUMENT")
	get(base+"/v1/carts/"+id, 200, "")
	get(base+"/v1/carts/us.0000000000000000000000000000", 404, "NOT_FOUND")
	s.do(exchange{c: shop, method: "GET", url: base + "/v1/carts/nonsense", status: 400, code: "INVALID_ARGUMENT", invalid: true})
	line1, _ := holds[1].(map[string]any)["hold_id"].(string)
	post(base+"/v1/holds/"+line1+"/confirm", map[string]string{"payment_id": "cp-0"}, 409, "CONFLICT")
	if conf := post(base+"/v1/carts/"+id+"/confirm", map[string]string{"payment_id": "cp-1"}, 200, ""); conf.str("outcome") != "sold" {
		t.Errorf("the cart's confirm: %v", conf.body)
	}
	s.do(exchange{c: shop, method: "POST", url: base + "/v1/carts/" + id + "/release", status: 409, code: "CONFLICT"})
	other := post(reserve, map[string]any{"user_id": "dan", "lines": both[:1], "request_key": "c3"}, 201, "")
	oid := other.str("cart_id")
	s.do(exchange{c: shop, method: "POST", url: base + "/v1/carts/" + oid + "/release", status: 200})
	if conf := post(base+"/v1/carts/"+oid+"/confirm", map[string]string{"payment_id": "cp-2"}, 200, ""); conf.str("outcome") != "refund" {
		t.Errorf("confirm of a released cart: %v", conf.body)
	}
	post(base+"/v1/carts/us.0000000000000000000000000000/confirm", map[string]string{"payment_id": "cp-3"}, 404, "NOT_FOUND")
	post(base+"/v1/carts/us.0000000000000000000000000000/release", map[string]any{}, 404, "NOT_FOUND")
}

// holdsAre reports whether a list of a buyer's holds is exactly want, each "hold_id=state",
// in order, and not truncated.
func holdsAre(a answer, want ...string) bool {
	hs, _ := a.body["holds"].([]any)
	if len(hs) != len(want) || a.body["truncated"] != false {
		return false
	}
	for i, h := range hs {
		m, _ := h.(map[string]any)
		if fmt.Sprintf("%v=%v", m["hold_id"], m["state"]) != want[i] {
			return false
		}
	}
	return true
}
