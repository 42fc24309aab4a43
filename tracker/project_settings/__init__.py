"""The project settings page's writes (`services`) and reads (`selectors`): the project itself,
members, tokens and deadlines. Not Django settings: those are config/settings/."""
