package warble

// Fuzz targets for the input validators. Each states properties of what is
// accepted and what is refused, not only that nothing panics. The seeds
// below and those under testdata/fuzz/<FuzzName>/ run as ordinary tests in
// go test; go test -run='^$' -fuzz='^FuzzName$' explores further (see
// .ci/fuzz).

import (
	"math"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"
)

// isCc reports whether r is in Unicode category Cc, written out rather than
// taken from package unicode, so that the properties below do not merely
// restate the code they check.
func isCc(r rune) bool { return r < 0x20 || r >= 0x7f && r <= 0x9f }

// isSpace reports whether r is one of the characters strings.TrimSpace trims.
func isSpace(r rune) bool {
	switch r {
	case '\t', '\n', '\v', '\f', '\r', ' ', 0x85, 0xa0, 0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}

// isTrimmed reports whether s neither starts nor ends with a space.
func isTrimmed(s string) bool {
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	return s == "" || !isSpace(first) && !isSpace(last)
}

// wantInvalid fails t unless err is a user-facing EINVALID error.
func wantInvalid(t *testing.T, what string, err error) {
	t.Helper()
	if code := ErrorCode(err); code != EINVALID {
		t.Fatalf("%s: error %v has code %q, want %q", what, err, code, EINVALID)
	}
	if msg := ErrorMessage(err); msg == "" || strings.Contains(msg, "warble error") {
		t.Fatalf("%s: message %q is not a sentence for users", what, msg)
	}
}

// Strings that a validator is likely to get wrong.
var trickyStrings = []string{
	"",
	" ",
	"ada",
	"Ada_Lovelace_1815",
	"\x00",
	"a\x00b",
	"\xff\xfe",
	"\xed\xa0\x80",  // an encoded surrogate
	"\xc0\x80",      // an overlong NUL
	"\u212aate",     // KELVIN SIGN: lower-cases to an ASCII k
	"\u0130stanbul", // dotted capital I: lower-cases to two runes
	"ﬀoo",           // a ligature
	"ｆｕｌｌｗｉｄｔｈ",     // fullwidth letters
	"e\u0301",       // a combining accent
	"\u202eevil",    // RIGHT-TO-LEFT OVERRIDE
	"\u200b",        // ZERO WIDTH SPACE, which TrimSpace keeps
	"\u0085x\u0085", // NEL: a control character that TrimSpace trims
	"\u00a0x\u3000", // no-break and ideographic spaces
	"x\u2028y",      // LINE SEPARATOR
	"x\u202ey",      // RIGHT-TO-LEFT OVERRIDE
	"x\u2066y",      // LEFT-TO-RIGHT ISOLATE
	"tab\there",     // a tab inside
	"line\nbreak",   // a newline inside
	"\r\n",          //
	"\x7f",          // DEL
	"\u009b",        // CSI, a C1 control
	"🐦🐦🐦",           // astral-plane runes
	"👩‍👩‍👧",         // a ZWJ sequence: one glyph, five runes
	strings.Repeat("a", 280),
	strings.Repeat("a", 281),
	strings.Repeat("é", 280),
	strings.Repeat("🐦", 281),
	" " + strings.Repeat("x", 280) + "\n",
}

func FuzzValidateUsername(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s)
	}
	for _, s := range []string{"ab", "abc", "ABC", "a_b", "___", "12345678901234567890", "123456789012345678901", "ada-l", "ada l", "ada.l", "Ada_"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		err := ValidateUsername(name)
		wellFormed := len(name) >= MinUsernameLen && len(name) <= MaxUsernameLen
		for i := 0; i < len(name); i++ {
			c := name[i]
			if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_') {
				wellFormed = false
			}
		}
		if err != nil {
			wantInvalid(t, "ValidateUsername", err)
			if wellFormed {
				t.Fatalf("ValidateUsername(%q) refused a well-formed name: %v", name, err)
			}
			return
		}
		if !wellFormed {
			t.Fatalf("ValidateUsername(%q) accepted a name that is not 3 to 20 bytes of [A-Za-z0-9_]", name)
		}

		// The uniqueness key of an accepted name is its ASCII lower case:
		// the same length, idempotent, and the same for every spelling
		// that differs only in case, all of them accepted too.
		key := UsernameKey(name)
		if len(key) != len(name) || !strings.EqualFold(key, name) {
			t.Fatalf("UsernameKey(%q) = %q, not the same name in another case", name, key)
		}
		if strings.ToLower(key) != key || UsernameKey(key) != key {
			t.Fatalf("UsernameKey(%q) = %q is not lower case, or not idempotent", name, key)
		}
		for _, variant := range []string{strings.ToUpper(name), key, swapCase(name)} {
			if err := ValidateUsername(variant); err != nil {
				t.Fatalf("ValidateUsername accepts %q but refuses %q: %v", name, variant, err)
			}
			if UsernameKey(variant) != key {
				t.Fatalf("UsernameKey(%q) = %q, UsernameKey(%q) = %q: the same name ignoring case has two keys", name, key, variant, UsernameKey(variant))
			}
		}
	})
}

// swapCase swaps the case of each ASCII letter of s.
func swapCase(s string) string {
	b := []byte(s)
	for i, c := range b {
		switch {
		case 'a' <= c && c <= 'z':
			b[i] = c - 'a' + 'A'
		case 'A' <= c && c <= 'Z':
			b[i] = c - 'A' + 'a'
		}
	}
	return string(b)
}

func FuzzValidateDisplayName(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s)
	}
	f.Add(strings.Repeat("ö", 50))
	f.Add(strings.Repeat("ö", 51))
	f.Add("Ada Lovelace")
	f.Fuzz(func(t *testing.T, name string) {
		err := ValidateDisplayName(name)
		n := utf8.RuneCountInString(name)
		ok := utf8.ValidString(name) && isTrimmed(name) && n >= 1 && n <= MaxDisplayNameLen &&
			!strings.ContainsFunc(name, func(r rune) bool { return isCc(r) || r == 0x2028 || r == 0x2029 || isBidiControl(r) })
		if err != nil {
			wantInvalid(t, "ValidateDisplayName", err)
			if ok {
				t.Fatalf("ValidateDisplayName(%q) refused a good name: %v", name, err)
			}
			return
		}
		if !ok {
			t.Fatalf("ValidateDisplayName(%q) accepted a name that is not valid UTF-8, trimmed, 1 to %d runes without control characters", name, MaxDisplayNameLen)
		}
	})
}

func FuzzSignupInputValidate(f *testing.F) {
	f.Add("ada", "correct horse", "Ada Lovelace", true)
	f.Add("ada", "correct horse", "", false)
	f.Add("ada", "correct horse", "", true)
	f.Add("ada", "1234567", "", false)
	f.Add("ada", strings.Repeat("p", 72), "", false)
	f.Add("ada", strings.Repeat("p", 73), "", false)
	f.Add("ada", strings.Repeat("é", 36), "", false) // 72 bytes, 36 runes
	f.Add("ad", "correct horse", "x", true)
	f.Add("ada", "correct horse", " Ada", true)
	f.Add("ada", "correct horse", "Ada\x00", true)
	f.Add("ada", "\x00\x00\x00\x00\x00\x00\x00\x00", "\xff", true)
	f.Fuzz(func(t *testing.T, username, password, displayName string, hasDisplayName bool) {
		in := SignupInput{Username: username, Password: password}
		if hasDisplayName {
			dn := displayName
			in.DisplayName = &dn
		}
		err := in.Validate()
		userErr := ValidateUsername(username)
		passOK := len(password) >= MinPasswordBytes && len(password) <= MaxPasswordBytes
		var nameErr error
		if hasDisplayName {
			nameErr = ValidateDisplayName(displayName)
		} else {
			nameErr = ValidateDisplayName(username)
		}
		if err != nil {
			wantInvalid(t, "SignupInput.Validate", err)
			if userErr == nil && passOK && nameErr == nil {
				t.Fatalf("Validate(%+v) refused an input whose every field is good: %v", in, err)
			}
			return
		}
		if userErr != nil || !passOK || nameErr != nil {
			t.Fatalf("Validate accepted username %q (%v), a password of %d bytes, display name %q (%v)",
				username, userErr, len(password), displayName, nameErr)
		}
		if in.DisplayName == nil {
			t.Fatal("Validate accepted an input and left DisplayName nil")
		}
		if want := displayName; !hasDisplayName && *in.DisplayName != username || hasDisplayName && *in.DisplayName != want {
			t.Fatalf("DisplayName = %q after Validate, want %q (given: %v)", *in.DisplayName, want, hasDisplayName)
		}
		if in.Username != username || in.Password != password {
			t.Fatal("Validate changed the username or the password")
		}
	})
}

// TestSignupInputValidate pins which field each refusal names.
func TestSignupInputValidate(t *testing.T) {
	str := func(s string) *string { return &s }
	for _, tc := range []struct {
		in      SignupInput
		wantErr string // a word the message must contain; "" for no error
	}{
		{SignupInput{Username: "ada", Password: "correct horse"}, ""},
		{SignupInput{Username: "Ada_1815", Password: "12345678", DisplayName: str("Ada 🐦")}, ""},
		{SignupInput{Username: "ada", Password: strings.Repeat("x", 72)}, ""},
		{SignupInput{Username: "ad", Password: "correct horse"}, "Username"},
		{SignupInput{Username: "ada!", Password: "correct horse"}, "Username"},
		{SignupInput{Username: "ada", Password: "1234567"}, "Password"},
		{SignupInput{Username: "ada", Password: strings.Repeat("x", 73)}, "Password"},
		{SignupInput{Username: "ada", Password: "correct horse", DisplayName: str("")}, "Display name"},
		{SignupInput{Username: "ada", Password: "correct horse", DisplayName: str(" Ada")}, "Display name"},
		{SignupInput{Username: "ada", Password: "correct horse", DisplayName: str("A\nda")}, "Display name"},
		{SignupInput{Username: "ada", Password: "correct horse", DisplayName: str(strings.Repeat("é", 51))}, "Display name"},
		{SignupInput{Username: "ada", Password: "correct horse", DisplayName: str("\xffAda")}, "Display name"},
		{SignupInput{Username: "bad name", Password: "x", DisplayName: str("")}, "Username"}, // the first field at fault
	} {
		in := tc.in
		err := in.Validate()
		if tc.wantErr == "" {
			if err != nil {
				t.Errorf("Validate(%+v): %v", tc.in, err)
			} else if in.DisplayName == nil || tc.in.DisplayName == nil && *in.DisplayName != in.Username {
				t.Errorf("Validate(%+v): display name not defaulted to the username", tc.in)
			}
			continue
		}
		if ErrorCode(err) != EINVALID || !strings.Contains(ErrorMessage(err), tc.wantErr) {
			t.Errorf("Validate(%+v) = %v, want EINVALID naming %s", tc.in, err, tc.wantErr)
		}
	}
}

func FuzzNormalizePostBody(f *testing.F) {
	for _, s := range trickyStrings {
		f.Add(s)
	}
	f.Add("hello, world")
	f.Add("  \n\thello\n\t  ")
	f.Add("a\tb\nc")
	f.Add("\x1b[31mred\x1b[0m")
	f.Add(strings.Repeat(" ", 1000) + "x" + strings.Repeat(" ", 1000))
	f.Add(strings.Repeat("🐦", 280))
	f.Fuzz(func(t *testing.T, body string) {
		got, err := NormalizePostBody(body)

		trimmed := strings.TrimSpace(body)
		n := utf8.RuneCountInString(trimmed)
		ok := utf8.ValidString(body) && n >= 1 && n <= MaxPostLen &&
			!strings.ContainsFunc(trimmed, func(r rune) bool {
				return r != '\n' && r != '\t' && (isCc(r) || r == 0x2028 || r == 0x2029 || isBidiControl(r))
			})
		if err != nil {
			wantInvalid(t, "NormalizePostBody", err)
			if ok {
				t.Fatalf("NormalizePostBody(%q) refused a good body: %v", body, err)
			}
			return
		}
		if !ok {
			t.Fatalf("NormalizePostBody(%q) accepted a body that is empty, too long, invalid UTF-8 or has control characters", body)
		}
		if got != trimmed {
			t.Fatalf("NormalizePostBody(%q) = %q, want the body trimmed: %q", body, got, trimmed)
		}
		if !utf8.ValidString(got) || !isTrimmed(got) {
			t.Fatalf("NormalizePostBody(%q) = %q: not valid UTF-8, or not trimmed", body, got)
		}
		if !strings.Contains(body, got) {
			t.Fatalf("NormalizePostBody(%q) = %q changed more than the surrounding whitespace", body, got)
		}
		if again, err := NormalizePostBody(got); err != nil || again != got {
			t.Fatalf("NormalizePostBody of its own result %q: %q, %v; want no change", got, again, err)
		}
	})
}

func FuzzPostCursor(f *testing.F) {
	f.Add("", int64(0))
	f.Add(PostCursor(1), int64(1))
	f.Add(PostCursor(math.MaxInt64), int64(math.MaxInt64))
	f.Add(PostCursor(-1), int64(-1))
	f.Add(PostCursor(math.MinInt64), int64(math.MinInt64))
	f.Add(encodeCursor("p007"), int64(7))
	f.Add(encodeCursor("p+7"), int64(7))
	f.Add(encodeCursor("p-0"), int64(0))
	f.Add(encodeCursor("p9223372036854775808"), int64(0))
	f.Add(encodeCursor("f1:2"), int64(0))
	f.Add(encodeCursor("p"), int64(0))
	f.Add(encodeCursor("p1 "), int64(0))
	f.Add("cDE=", int64(1))                  // padded
	f.Add("cDE\n", int64(1))                 // a newline the decoder skips
	f.Add("cDF", int64(1))                   // non-zero trailing bits
	f.Add("cD+", int64(0))                   // the standard alphabet
	f.Add("%%%%", int64(0))                  //
	f.Add(strings.Repeat("A", 65), int64(0)) // over the length limit
	f.Add(encodeCursor("p"+strings.Repeat("0", 50)+"1"), int64(1))
	f.Fuzz(func(t *testing.T, cursor string, n int64) {
		// Every cursor the server hands out parses back to its seq; a
		// negative seq, which no post has, gives none that parses.
		c := PostCursor(n)
		seq, err := ParsePostCursor(c)
		switch {
		case n >= 0 && (err != nil || seq != n):
			t.Fatalf("ParsePostCursor(PostCursor(%d) = %q) = %d, %v", n, c, seq, err)
		case n < 0 && err == nil:
			t.Fatalf("ParsePostCursor(PostCursor(%d) = %q) accepted a negative seq", n, c)
		case len(c) > 64:
			t.Fatalf("PostCursor(%d) = %q is longer than the parser takes", n, c)
		}
		if got := string(AppendPostCursor([]byte(cursor), n)); got != cursor+c {
			t.Fatalf("AppendPostCursor(%q, %d) = %q, want %q", cursor, n, got, cursor+c)
		}

		// Any other string either is refused as EINVALID or is exactly
		// the cursor of the seq it parses to: one position, one cursor.
		seq, err = ParsePostCursor(cursor)
		if err != nil {
			wantInvalid(t, "ParsePostCursor", err)
			return
		}
		if seq < 0 {
			t.Fatalf("ParsePostCursor(%q) = %d, a negative seq", cursor, seq)
		}
		if again := PostCursor(seq); again != cursor {
			t.Fatalf("ParsePostCursor(%q) = %d, but PostCursor(%d) = %q: two cursors for one position", cursor, seq, seq, again)
		}
		if _, _, err := ParseFollowCursor(cursor); err == nil {
			t.Fatalf("%q parses both as a post cursor and as a follow cursor", cursor)
		}
	})
}

func FuzzFollowCursor(f *testing.F) {
	f.Add("", int64(0), "1")
	f.Add(FollowCursor(time.UnixMilli(1_700_000_000_000), "42"), int64(1_700_000_000_000), "42")
	f.Add(FollowCursor(time.UnixMilli(math.MaxInt64), "999999999999999999"), int64(math.MaxInt64), "999999999999999999")
	f.Add(FollowCursor(time.UnixMilli(-1), "1"), int64(-1), "1")
	f.Add(encodeCursor("f1:01"), int64(1), "01")
	f.Add(encodeCursor("f01:1"), int64(1), "1")
	f.Add(encodeCursor("f+1:1"), int64(1), "1")
	f.Add(encodeCursor("f-0:1"), int64(0), "1")
	f.Add(encodeCursor("f1:1:1"), int64(1), "1:1")
	f.Add(encodeCursor("f:1"), int64(0), "")
	f.Add(encodeCursor("f1:"), int64(1), "")
	f.Add(encodeCursor("f1:1234567890123456789"), int64(1), "1234567890123456789")
	f.Add(encodeCursor("p1"), int64(1), "1")
	f.Add("ZjE6MQ", int64(1), "1")   // f1:1
	f.Add("ZjE6MR", int64(1), "1")   // f1:1 with non-zero trailing bits
	f.Add("ZjE6MQ==", int64(1), "1") // padded
	f.Add("ZjE6\r\nMQ", int64(1), "1")
	f.Add("ZjE6MQ\x00", int64(1), "1")
	f.Fuzz(func(t *testing.T, cursor string, ms int64, userID string) {
		c := FollowCursor(time.UnixMilli(ms), userID)
		gotMS, gotID, err := ParseFollowCursor(c)
		valid := ms >= 0 && ValidUserID(userID)
		switch {
		case valid && (err != nil || gotMS != ms || gotID != userID):
			t.Fatalf("ParseFollowCursor(FollowCursor(%d, %q) = %q) = %d, %q, %v", ms, userID, c, gotMS, gotID, err)
		case !valid && err == nil:
			t.Fatalf("ParseFollowCursor(FollowCursor(%d, %q) = %q) accepted a position no follow has", ms, userID, c)
		case valid && len(c) > 64:
			t.Fatalf("FollowCursor(%d, %q) = %q is longer than the parser takes", ms, userID, c)
		}

		gotMS, gotID, err = ParseFollowCursor(cursor)
		if err != nil {
			wantInvalid(t, "ParseFollowCursor", err)
			return
		}
		if gotMS < 0 || !ValidUserID(gotID) {
			t.Fatalf("ParseFollowCursor(%q) = %d, %q: not a follow position", cursor, gotMS, gotID)
		}
		if again := FollowCursor(time.UnixMilli(gotMS), gotID); again != cursor {
			t.Fatalf("ParseFollowCursor(%q) = %d, %q, but FollowCursor gives %q: two cursors for one position", cursor, gotMS, gotID, again)
		}
		if _, err := ParsePostCursor(cursor); err == nil {
			t.Fatalf("%q parses both as a follow cursor and as a post cursor", cursor)
		}
	})
}

func FuzzIDs(f *testing.F) {
	for _, s := range []string{
		"", "0", "1", "01", "42", "-1", "+1", " 1", "1 ", "1e3", "0x1", "١٢", // Arabic-Indic digits
		"999999999999999999", "1000000000000000000", "9223372036854775807", "18446744073709551616",
		"1:1", "1:0", "0:1", "1:01", "1:", ":1", ":", "1::1", "1:1:1", "12:345", "a:1", "1:a",
		"999999999999999999:999999999999999999", "1:1000000000000000000",
		"VXNlcjox", // a base64 global id of the Relay kind, which Warble does not use
	} {
		f.Add(s, "7")
	}
	f.Fuzz(func(t *testing.T, id, other string) {
		user, post, author := ValidUserID(id), IsPostID(id), PostAuthorID(id)

		if user {
			n, err := strconv.ParseInt(id, 10, 64)
			if err != nil || n <= 0 || strconv.FormatInt(n, 10) != id || len(id) > 18 {
				t.Fatalf("ValidUserID(%q) accepted what is not a decimal without leading zeros of at most 18 digits", id)
			}
		} else if n, err := strconv.ParseInt(id, 10, 64); err == nil && n > 0 && n < 1e18 && strconv.FormatInt(n, 10) == id {
			t.Fatalf("ValidUserID(%q) refused a good user id", id)
		}

		if user && post {
			t.Fatalf("%q is both a user id and a post id", id)
		}
		if post != (author != "") {
			t.Fatalf("IsPostID(%q) = %v but PostAuthorID = %q", id, post, author)
		}
		a, seq, found := strings.Cut(id, ":")
		want := found && ValidUserID(a) && ValidUserID(seq)
		if post != want {
			t.Fatalf("IsPostID(%q) = %v, want %v: a post id is <user id>:<seq>", id, post, want)
		}
		if post && (author != a || author+":"+seq != id || !ValidUserID(author)) {
			t.Fatalf("PostAuthorID(%q) = %q, want %q", id, author, a)
		}

		// Joining two good ids makes a post id whose author is the first.
		joined := id + ":" + other
		if ValidUserID(id) && ValidUserID(other) {
			if !IsPostID(joined) || PostAuthorID(joined) != id || ValidUserID(joined) {
				t.Fatalf("%q, made of two good ids, is not a post id by %q", joined, id)
			}
		} else if IsPostID(joined) {
			t.Fatalf("IsPostID(%q) though %q or %q is not a good id", joined, id, other)
		}
	})
}

// TestPageArgsValidate checks the bounds of first.
func TestPageArgsValidate(t *testing.T) {
	for _, first := range []int{math.MinInt, -1, 0, 1, 20, 100, 101, math.MaxInt} {
		err := PageArgs{First: first}.Validate(MaxPageSize)
		if ok := first >= 1 && first <= MaxPageSize; ok != (err == nil) {
			t.Errorf("PageArgs{First: %d}.Validate(%d) = %v", first, MaxPageSize, err)
		} else if err != nil && ErrorCode(err) != EINVALID {
			t.Errorf("PageArgs{First: %d}.Validate: code %q, want %q", first, ErrorCode(err), EINVALID)
		}
	}
}

// isBidiControl is the written-out rule for the bidirectional embedding,
// override and isolate controls: U+202A to U+202E and U+2066 to U+2069.
func isBidiControl(r rune) bool {
	return (r >= 0x202a && r <= 0x202e) || (r >= 0x2066 && r <= 0x2069)
}
