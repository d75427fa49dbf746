// Every GraphQL document the app sends. Teams building their own frontend
// can copy these: they are the API's intended use.

const POST_FIELDS = `
fragment PostFields on Post {
  id
  body
  createdAt
  author { id username displayName }
}`;

const TIMELINE_FIELDS = `
fragment TimelineFields on Timeline {
  edges { cursor node { ...PostFields } }
  pageInfo { hasNextPage endCursor }
}
${POST_FIELDS}`;

const EVENT_FIELDS = `
fragment EventFields on TimelineEvent {
  kind
  cursor
  postId
  post { ...PostFields }
}
${POST_FIELDS}`;

const USER_LIST_FIELDS = `
fragment UserListFields on UserConnection {
  totalCount
  edges { cursor followedAt node { id username displayName followsViewer } }
  pageInfo { hasNextPage endCursor }
}`;

export const VIEWER = `query Viewer { viewer { id username displayName } }`;

export const SIGNUP = `
mutation Signup($input: SignupInput!) {
  signup(input: $input) { token user { id username displayName } }
}`;

export const LOGIN = `
mutation Login($input: LoginInput!) {
  login(input: $input) { token user { id username displayName } }
}`;

export const LOGOUT = `mutation Logout { logout }`;

export const HOME_TIMELINE = `
query HomeTimeline($first: Int, $after: String) {
  homeTimeline(first: $first, after: $after) { ...TimelineFields }
}
${TIMELINE_FIELDS}`;

export const GLOBAL_TIMELINE = `
query GlobalTimeline($first: Int, $after: String) {
  globalTimeline(first: $first, after: $after) { ...TimelineFields }
}
${TIMELINE_FIELDS}`;

export const USER_POSTS = `
query UserPosts($username: String!, $first: Int, $after: String) {
  user(username: $username) { id posts(first: $first, after: $after) { ...TimelineFields } }
}
${TIMELINE_FIELDS}`;

export const NEWEST_USERS = `
query NewestUsers($first: Int) {
  newestUsers(first: $first) { id username displayName createdAt followersCount viewerIsFollowing }
}`;

export const PROFILE = `
query Profile($username: String!) {
  user(username: $username) {
    id
    username
    displayName
    createdAt
    postsCount
    followersCount
    followingCount
    viewerIsFollowing
    followsViewer
    followersYouFollow(first: 3) { totalCount edges { node { id username displayName } } }
    commonFollowers(first: 3) { totalCount edges { node { id username displayName } } }
  }
}`;

export const FOLLOWERS = `
query Followers($username: String!, $first: Int, $after: String) {
  user(username: $username) { id followers(first: $first, after: $after) { ...UserListFields } }
}
${USER_LIST_FIELDS}`;

export const FOLLOWING = `
query Following($username: String!, $first: Int, $after: String) {
  user(username: $username) { id following(first: $first, after: $after) { ...UserListFields } }
}
${USER_LIST_FIELDS}`;

export const CREATE_POST = `
mutation CreatePost($input: CreatePostInput!) {
  createPost(input: $input) { post { ...PostFields } }
}
${POST_FIELDS}`;

export const DELETE_POST = `
mutation DeletePost($input: DeletePostInput!) {
  deletePost(input: $input) { postId }
}`;

const FOLLOW_RESULT = `user { id followersCount viewerIsFollowing } viewer { id followingCount }`;

export const FOLLOW = `
mutation Follow($input: FollowInput!) { follow(input: $input) { ${FOLLOW_RESULT} } }`;

export const UNFOLLOW = `
mutation Unfollow($input: FollowInput!) { unfollow(input: $input) { ${FOLLOW_RESULT} } }`;

export const HOME_EVENTS = `
subscription HomeEvents($after: String) {
  homeTimeline(after: $after) { ...EventFields }
}
${EVENT_FIELDS}`;

export const GLOBAL_EVENTS = `
subscription GlobalEvents($after: String) {
  globalTimeline(after: $after) { ...EventFields }
}
${EVENT_FIELDS}`;

export const USER_EVENTS = `
subscription UserEvents($username: String!, $after: String) {
  userPosts(username: $username, after: $after) { ...EventFields }
}
${EVENT_FIELDS}`;
