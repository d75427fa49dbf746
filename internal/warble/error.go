package warble

import (
	"errors"
	"fmt"
	"time"
)

// Error codes. Each maps to one extensions.code in the GraphQL API.
const (
	ECONFLICT        = "conflict"
	EFORBIDDEN       = "forbidden"
	EINTERNAL        = "internal"
	EINVALID         = "invalid"
	ENOTFOUND        = "not_found"
	ERATELIMITED     = "rate_limited"
	EUNAUTHENTICATED = "unauthenticated"
)

// Error is an error a user may see: a code and a message that is safe to show
// as it is. Any other error is internal and is never shown to users.
type Error struct {
	Code    string // one of the E* constants
	Message string // a full sentence, e.g. `Username "ada" is taken.`

	// RetryAfter, for ERATELIMITED, is how long to wait before trying again.
	RetryAfter time.Duration
}

// Error implements the error interface.
func (e *Error) Error() string {
	return fmt.Sprintf("warble error: code=%s message=%s", e.Code, e.Message)
}

// Errorf returns an *Error with the given code and a formatted message.
func Errorf(code, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// ErrorCode returns the code of err if it is or wraps an *Error, "" for nil,
// and EINTERNAL for any other error.
func ErrorCode(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Code
	}
	return EINTERNAL
}

// ErrorMessage returns the user-facing message of err if it is or wraps an
// *Error, and a generic message for any other non-nil error.
func ErrorMessage(err error) string {
	var e *Error
	if err == nil {
		return ""
	} else if errors.As(err, &e) {
		return e.Message
	}
	return "Internal error."
}
