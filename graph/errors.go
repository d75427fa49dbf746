package graph

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"runtime/debug"
	"strings"
	"time"

	"github.com/99designs/gqlgen/graphql"
	"github.com/vektah/gqlparser/v2/gqlerror"

	"github.com/warble/warble/internal/warble"
)

// The extensions.code values of Warble's own errors. Parse and validation
// errors keep gqlgen's GRAPHQL_* codes.
const (
	CodeBadUserInput    = "BAD_USER_INPUT"
	CodeUnauthenticated = "UNAUTHENTICATED"
	CodeForbidden       = "FORBIDDEN"
	CodeNotFound        = "NOT_FOUND"
	CodeConflict        = "CONFLICT"
	CodeRateLimited     = "RATE_LIMITED"
	CodeInternal        = "INTERNAL"
)

var codes = map[string]string{
	warble.EINVALID:         CodeBadUserInput,
	warble.EUNAUTHENTICATED: CodeUnauthenticated,
	warble.EFORBIDDEN:       CodeForbidden,
	warble.ENOTFOUND:        CodeNotFound,
	warble.ECONFLICT:        CodeConflict,
	warble.ERATELIMITED:     CodeRateLimited,
}

// ErrorPresenter is the one place that turns errors into what clients see.
// Domain errors show their message and code; errors that already carry a
// code (parse and validation errors) pass as they are; anything else is
// logged with its cause and shown as "Internal error." with INTERNAL, so that
// no Redis detail or stack trace reaches a client.
func ErrorPresenter(log *slog.Logger) graphql.ErrorPresenterFunc {
	return func(ctx context.Context, err error) *gqlerror.Error {
		gqlErr := graphql.DefaultErrorPresenter(ctx, err)
		var werr *warble.Error
		if errors.As(err, &werr) {
			code, ok := codes[werr.Code]
			if !ok {
				code = CodeInternal
			}
			gqlErr.Message = werr.Message
			gqlErr.Extensions = map[string]any{"code": code}
			if werr.RetryAfter > 0 {
				// Whole seconds, like HTTP's Retry-After.
				gqlErr.Extensions["retryAfter"] = int(werr.RetryAfter / time.Second)
			}
			return gqlErr
		}
		if _, ok := gqlErr.Extensions["code"]; ok && gqlErr.Err == nil {
			return gqlErr
		}
		var ge *gqlerror.Error
		if errors.As(err, &ge) && ge.Err == nil && ge.Rule != "" {
			return gqlErr // a validation rule's error without a code
		}
		if errors.As(err, &ge) && ge.Err == nil && strings.Contains(ge.Message, "APQ") {
			// The persisted query extension's complaints about its input
			// (a hash that does not match, an unknown version) are short
			// and meant for the client.
			return &gqlerror.Error{Message: ge.Message, Extensions: map[string]any{"code": CodeBadUserInput}}
		}
		if errors.As(err, &ge) && ge.Err == nil && strings.HasPrefix(ge.Message, "json request body could not be decoded") {
			// gqlgen's complaint about a body that is not a JSON request
			// (not JSON, variables that are not an object, a numeric
			// operationName): the client's fault. Its text quotes the
			// whole body, so a plain sentence goes back instead.
			return &gqlerror.Error{
				Message:    "The request is not a valid GraphQL request: send a JSON object with query and, optionally, variables (an object) and operationName (a string).",
				Extensions: map[string]any{"code": CodeBadUserInput},
			}
		}
		msg := "Internal error."
		if unavailable(err) {
			msg = unavailableMessage
		}
		log.ErrorContext(ctx, "graphql: internal error", "path", gqlErr.Path.String(), "err", err)
		return &gqlerror.Error{
			Message:    msg,
			Path:       gqlErr.Path,
			Extensions: map[string]any{"code": CodeInternal},
		}
	}
}

// unavailableMessage is what a client reads when the data store is out of
// reach.
const unavailableMessage = "The service is temporarily unavailable. Please try again."

// unavailable reports whether err is a failure to reach the data store, a
// network error or a connection that ended mid-answer, rather than a fault
// of the request or a bug: trying again later may work. graph does not know
// which store it is, so it asks only the standard library's error types.
func unavailable(err error) bool {
	var netErr net.Error
	return errors.As(err, &netErr) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF)
}

// RecoverFunc logs a panic in a resolver with its stack and answers with an
// internal error instead of crashing the process.
func RecoverFunc(log *slog.Logger) graphql.RecoverFunc {
	return func(ctx context.Context, p any) error {
		log.ErrorContext(ctx, "graphql: panic", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
		return errors.New("panic in resolver")
	}
}
